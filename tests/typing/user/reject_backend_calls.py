"""#35 items 7 (XLA's auto_optim) and 11: a call only some backends take is refused on the others and
on a bare DistContext (any backend)."""

from __future__ import annotations

import torch
from torch import nn

import idist


def accumulate(ctx: idist.DistContext, model: nn.Module) -> None:
    # rejected: mypy[misc] pyright[reportAttributeAccessIssue,reportUnknownMemberType]
    with ctx.no_sync(model):
        pass


def shard(ctx: idist.DistContext, model: nn.Module) -> None:
    # rejected: mypy[arg-type] pyright[reportArgumentType]
    ctx.auto_model(model, strategy="fsdp")


def horovod_options(ctx: idist.DistContext, opt: torch.optim.SGD) -> None:
    # rejected: mypy[call-arg] pyright[reportCallIssue]
    ctx.auto_optim(opt, backward_passes_per_step=4)


def xla_options(ctx: idist.XlaContext, opt: torch.optim.SGD) -> None:
    # rejected: mypy[call-overload] pyright[reportCallIssue]
    ctx.auto_optim(opt, backward_passes_per_step=4)


def horovod_no_sync(ctx: idist.HorovodContext, model: nn.Module) -> None:
    # rejected: mypy[misc] pyright[reportAttributeAccessIssue,reportUnknownMemberType]
    with ctx.no_sync(model):
        pass


def horovod_process_set(ctx: idist.HorovodContext, opt: torch.optim.SGD) -> None:
    # rejected: mypy[call-overload] pyright[reportArgumentType]
    ctx.auto_optim(opt, process_set=12345)


def adasum_on_any(ctx: idist.DistContext, t: torch.Tensor) -> None:
    with idist.use(ctx) as same:
        # rejected: mypy[call-overload] pyright[reportCallIssue,reportArgumentType]
        same.all_reduce(t, "ADASUM")
