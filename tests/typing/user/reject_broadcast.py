"""#35 items 2 and 7 (Parameter): what ``broadcast`` gives when a rank can get None, or a new tensor."""

from __future__ import annotations

import torch
from torch import nn

import idist


def shout(ctx: idist.DistContext) -> None:
    # src passes None here: every rank gets None
    word = ctx.broadcast(None if ctx.rank == 0 else "hi", src=0)
    # rejected: mypy[union-attr] pyright[reportOptionalMemberAccess]
    word.upper()


def outside(ctx: idist.DistContext) -> None:
    # rank 1 is outside the group: it gets its own None back
    word = ctx.broadcast("hi" if ctx.rank == 0 else None, src=0, group=[0])
    # rejected: mypy[union-attr] pyright[reportOptionalMemberAccess]
    word.upper()


def into_parameter(ctx: idist.DistContext) -> None:
    layer = nn.Linear(2, 2)
    # a placeholder that does not fit (shape) is replaced by a new plain Tensor, not a Parameter
    placeholder = layer.weight if ctx.rank == 0 else nn.Parameter(torch.zeros(1))
    # rejected: mypy[arg-type] pyright[reportArgumentType]
    layer.register_parameter("weight", ctx.broadcast(placeholder, src=0))
