"""Type tests for the core API: checked by mypy (strict, warn_unused_ignores), never executed."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any, assert_type

import torch
from torch._C._distributed_c10d import TCPStore

import idist
from idist import DistContext, NativeContext, SerialContext


def static_backend_selection(backend: str) -> None:
    assert_type(idist.initialize(), DistContext)
    assert_type(idist.initialize(None), DistContext)
    assert_type(idist.initialize("gloo"), NativeContext)
    assert_type(idist.initialize("nccl"), NativeContext)
    assert_type(idist.initialize("mpi"), NativeContext)
    assert_type(idist.initialize("serial"), SerialContext)
    # a name known only when the code runs (a str) gives a bare DistContext; the runtime checks it
    assert_type(idist.initialize(backend), DistContext)
    assert_type(idist.initialize(idist.available_backends()[0]), DistContext)
    with idist.context(backend) as dyn:
        assert_type(dyn, DistContext)
    idist.initialize(backend, timeout=5.0)  # type: ignore[call-overload]
    with idist.context("gloo") as ctx:
        assert_type(ctx, NativeContext)
    with idist.context() as any_ctx:
        assert_type(any_ctx, DistContext)


def initialize_takes_each_backends_own_options(store: TCPStore) -> None:
    idist.initialize("gloo", rank=0, world_size=2, master_addr="10.0.0.1", master_port=29500, timeout=30.0)
    idist.initialize("nccl", init_method="env://", timeout=datetime.timedelta(seconds=30), checked=True)
    idist.initialize("gloo", rank=0, world_size=1, store=store, liveness=10)
    # without a backend the launcher decides, and may decide serial, which takes no options
    idist.initialize(rank=0, world_size=1, store=store)  # type: ignore[call-overload]
    idist.context(checked=True)  # type: ignore[call-overload]
    idist.initialize("xla-tpu", timeout=60.0)
    with idist.context("gloo", rank=None, world_size=None, checked=None) as ctx:
        assert_type(ctx, NativeContext)
    idist.initialize("serial", timeout=1.0)  # type: ignore[call-overload]
    idist.initialize("gloo", world=2)  # type: ignore[call-overload]
    idist.initialize("gloo", rank="0")  # type: ignore[call-overload]
    idist.initialize("xla-tpu", rank=0)  # type: ignore[call-overload]
    idist.initialize("xla-tpu", timeout=datetime.timedelta(seconds=1))  # type: ignore[call-overload]
    idist.context("gloo", nproc_per_node=2)  # type: ignore[call-overload]
    idist.context("serial", checked=True)  # type: ignore[call-overload]


def collectives_are_overloaded_on_the_value(ctx: NativeContext, t: torch.Tensor) -> None:
    assert_type(ctx.all_reduce(t), torch.Tensor)
    assert_type(ctx.all_reduce(1.5), float)
    assert_type(ctx.all_reduce(3), int)
    assert_type(ctx.all_reduce(True, "OR"), bool)
    assert_type(ctx.all_gather(t), list[torch.Tensor])
    assert_type(ctx.all_gather("s"), list[str])
    assert_type(ctx.all_gather(b"b"), list[bytes])
    assert_type(ctx.all_gather(Path("p")), list[Path])
    assert_type(ctx.all_gather({"k": 1}), list[dict[str, int]])
    maybe: float | None = 1.0 if ctx.rank == 0 else None
    assert_type(ctx.broadcast(maybe), float | None)  # None on every rank when src passes None
    assert_type(ctx.broadcast(1.0 if ctx.rank == 0 else 0.0), float)
    assert_type(ctx.broadcast(t, src=1), torch.Tensor)
    ctx.all_reduce(t, "MEAN")  # type: ignore[call-overload]
    ctx.all_reduce(t, "ADASUM")  # type: ignore[call-overload]
    ctx.all_reduce("text")  # type: ignore[call-overload]


def module_functions_match(t: torch.Tensor) -> None:
    assert_type(idist.all_reduce(t), torch.Tensor)
    assert_type(idist.all_reduce(2), int)
    assert_type(idist.all_reduce(2.0, "AVERAGE"), float)
    assert_type(idist.all_gather(t), list[torch.Tensor])
    assert_type(idist.all_gather(1), list[int])
    assert_type(idist.get_rank(), int)
    assert_type(idist.rank(), int)
    assert_type(idist.device(), torch.device)
    assert_type(idist.has_xla_support(), bool)
    assert_type(idist.current(), DistContext)
    idist.all_reduce(t, op="sum")  # type: ignore[call-overload]


def contexts_are_immutable(ctx: NativeContext) -> None:
    ctx.rank = 3  # type: ignore[misc]


def broadcast_of_none_is_any(ctx: NativeContext, maybe: str | None) -> None:
    got = ctx.broadcast(None, 0)
    assert_type(got, Any)
    assert_type(idist.broadcast(None), Any)
    assert_type(ctx.broadcast(maybe), str | None)
    got.anything_src_sent  # Any: the code after a None-receiver broadcast is reachable


def group_takes_ranks_groups_and_backend_groups_not_str(ctx: NativeContext, g: idist.Group) -> None:
    ctx.all_reduce(1, group=[0, 1])
    ctx.all_reduce(1, group=range(2))
    ctx.all_reduce(1, group=g)
    ctx.barrier(group=(0,))
    ctx.all_reduce(1, group="oops")  # type: ignore[call-overload]
    ctx.barrier(group="oops")  # type: ignore[arg-type]
    idist.all_gather(1, group="oops")  # type: ignore[call-overload]


def public_aliases_are_exported() -> tuple[object, ...]:
    op: idist.ReduceOp = "AVERAGE"
    name: idist.BackendName = "xla-tpu"
    model: idist.ModelName = "native-dist"
    hvd_op: idist.HorovodReduceOp = "ADASUM"
    group: idist.GroupArg = [0, 1]
    bad_op: idist.ReduceOp = "MEAN"  # type: ignore[assignment]
    return op, name, model, hvd_op, group, bad_op
