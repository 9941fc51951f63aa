"""#35 items 7, 10 and 11, accepted: narrow a context to the backends that take a call."""

from __future__ import annotations

from typing import reveal_type

import torch
import torch.distributed as dist
from torch import nn

import idist


def accumulate(ctx: idist.DistContext, model: nn.Module) -> None:
    if isinstance(ctx, idist.NativeContext | idist.SerialContext | idist.XlaContext):
        with ctx.no_sync(model):
            pass
    with idist.no_sync(model):  # the module function: the backend that runs decides
        pass


def shard(ctx: idist.DistContext, model: nn.Linear) -> nn.Module:
    if isinstance(ctx, idist.NativeContext):
        reveal_type(ctx.auto_model(model, strategy="fsdp"))  # revealed: Linear
    return ctx.auto_model(model)


def optimizers(ctx: idist.DistContext, x: idist.XlaContext, h: idist.HorovodContext, opt: torch.optim.SGD) -> None:
    reveal_type(ctx.auto_optim(opt))  # revealed: SGD
    reveal_type(x.auto_optim(opt))  # revealed: SGD
    with idist.use(h) as same:
        same.auto_optim(opt, backward_passes_per_step=4)
        reveal_type(same.all_reduce(torch.ones(2), "ADASUM"))  # revealed: Tensor


def process_group(ctx: idist.NativeContext, model: nn.Linear) -> None:
    reveal_type(ctx.process_group)  # revealed: ProcessGroup
    reveal_type(dist.get_world_size(ctx.process_group))  # revealed: int
    dist.barrier(group=ctx.process_group)  # pyright: ignore[reportUnknownMemberType]  # torch leaves device_ids untyped
    ctx.auto_model(model, process_group=ctx.process_group)
