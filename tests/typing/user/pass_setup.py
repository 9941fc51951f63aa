"""#35 items 5, 8, 9 and 11, accepted: options with the backend that takes them, dynamic names, use()."""

from __future__ import annotations

from typing import reveal_type

import torch

import idist


def literal_backends() -> None:
    reveal_type(idist.initialize("gloo", liveness=10, timeout=30.0, checked=True))  # revealed: NativeContext
    reveal_type(idist.initialize())  # revealed: DistContext[Comm]
    with idist.context("horovod", timeout=60.0) as hctx:
        reveal_type(hctx)  # revealed: HorovodContext


def dynamic_names(name: str, ctx: idist.DistContext) -> None:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    reveal_type(idist.initialize(name))  # revealed: DistContext[Comm]
    reveal_type(idist.initialize(ctx.backend))  # revealed: DistContext[Comm]
    reveal_type(idist.initialize(idist.available_backends()[0]))  # revealed: DistContext[Comm]
    with idist.context(backend) as dyn:
        dyn.barrier()
    native: idist.NativeBackend = "nccl" if torch.cuda.is_available() else "gloo"
    reveal_type(idist.initialize(native, timeout=30.0))  # revealed: NativeContext


def use_keeps_the_type(hctx: idist.HorovodContext, ctx: idist.DistContext) -> None:
    with idist.use(hctx) as same:
        reveal_type(same)  # revealed: HorovodContext
    with idist.use(ctx) as any_ctx:
        reveal_type(any_ctx)  # revealed: DistContext[Comm]
    reveal_type(idist.current())  # revealed: DistContext[Comm]


def in_a_str(name: str) -> str:
    with idist.context(name) as ctx:
        return ctx.backend
