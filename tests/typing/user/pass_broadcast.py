"""#35 items 2 and 7, accepted: a receiver's None is checked, or a placeholder of src's type is passed."""

from __future__ import annotations

from typing import Any, reveal_type

import torch
from torch import nn

import idist


def shout(ctx: idist.DistContext) -> str:
    word = ctx.broadcast("hi" if ctx.rank == 0 else None, src=0)
    reveal_type(word)  # revealed: str | None
    return "" if word is None else word.upper()


def placeholder(ctx: idist.DistContext) -> str:
    word = ctx.broadcast("hi" if ctx.rank == 0 else "", src=0)  # the others pass a str too
    reveal_type(word)  # revealed: str
    return word.upper()


def receiver(ctx: idist.DistContext) -> object:
    got = ctx.broadcast(None, src=0) if ctx.rank else ctx.broadcast({"lr": 0.1}, src=0)
    reveal_type(ctx.broadcast(None, src=0))  # revealed: Any
    return got


def into_parameter(ctx: idist.DistContext) -> nn.Linear:
    layer = nn.Linear(2, 2)
    new = ctx.broadcast(layer.weight, src=0)
    reveal_type(new)  # revealed: Tensor
    with torch.no_grad():
        layer.weight.copy_(new)
    return layer


def tensors(ctx: idist.DistContext, t: torch.Tensor | None) -> Any:
    reveal_type(idist.broadcast(t))  # revealed: Tensor | None
    reveal_type(idist.broadcast(torch.ones(2)))  # revealed: Tensor
    return None
