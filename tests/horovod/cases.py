"""Rank-side functions for the Horovod tests (run by ``_worker.py`` under horovodrun).

Each one initializes idist the way a user's script would (``idist.initialize()`` with no
backend: horovodrun's environment selects Horovod) and returns what it saw.
"""

from __future__ import annotations

import os
from typing import Any

import torch

import idist
from semantics_cases import broadcast_rows, gather_rows

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
    torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.uint16, torch.uint32, torch.uint64,
]  # fmt: skip


def _inputs(dtype: torch.dtype, rank: int) -> torch.Tensor:
    """A 2x3 tensor per rank whose values differ between ranks (small, so no dtype overflows)."""
    g = torch.Generator().manual_seed(1000 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (2, 3), generator=g).bool()
    if dtype.is_complex:
        return torch.complex(torch.randn(2, 3, generator=g), torch.randn(2, 3, generator=g)).to(dtype)
    if dtype.is_floating_point:
        return (torch.randint(-8, 9, (2, 3), generator=g).double() / 4).to(dtype)
    return torch.randint(0, 12, (2, 3), generator=g).to(dtype)


def portable(t: torch.Tensor) -> tuple[tuple[int, ...], torch.Tensor]:
    """A tensor as (shape, its bytes): torch 2.13 cannot unpickle uint16/32/64 tensors."""
    return tuple(t.shape), t.detach().contiguous().reshape(-1).view(torch.uint8).clone()


def rows() -> dict[str, Any]:
    """The collective semantics, row by row, on this rank."""
    ctx = idist.initialize()
    rank, n = ctx.rank, ctx.world_size
    out: dict[str, Any] = {"type": type(ctx).__name__, "backend": ctx.backend, "model": ctx.model_name()}
    out["topology"] = (ctx.rank, ctx.world_size, ctx.local_rank, ctx.nproc_per_node, ctx.node_rank, ctx.nnodes)
    out["module_queries"] = (idist.get_rank(), idist.get_world_size(), idist.backend(), str(idist.device()))
    try:
        # tensors: in place, same object, every dtype and op (native, widened, emulated)
        t = torch.full((3,), float(rank + 1))
        out["tensor_inplace"] = (ctx.all_reduce(t) is t, t.tolist())
        reduced: dict[str, Any] = {}
        for dtype in DTYPES:
            for op in ("SUM", "PRODUCT", "MIN", "MAX", "AVERAGE", "AND", "OR"):
                x = _inputs(dtype, rank)
                try:
                    same = idist.all_reduce(x, op) is x
                    reduced[f"{dtype}/{op}"] = ("ok", same, x.dtype, portable(x))
                except idist.UnsupportedOpError as exc:
                    reduced[f"{dtype}/{op}"] = ("rejected", str(exc))
        out["reduced"] = reduced
        nc = torch.arange(6.0).reshape(2, 3).t()
        ctx.all_reduce(nc)
        out["noncontig"] = (nc.tolist(), nc.is_contiguous())
        out["empty"] = tuple(ctx.all_reduce(torch.empty(0)).shape)
        # ADASUM: floating-point tensors, checked against the formula in the test
        grads = [_inputs(torch.float64, r).reshape(-1) for r in range(n)]
        a = grads[rank].clone()
        out["adasum"] = (ctx.all_reduce(a, "ADASUM") is a, a.clone())
        # Python numbers: exact, typed back
        out["int"] = ctx.all_reduce(2**53 + rank)
        out["float"] = ctx.all_reduce(0.1 * (rank + 1))
        out["float_max"] = ctx.all_reduce(1e300 if rank == 0 else -0.0, "MAX")
        out["bool_any"] = ctx.all_reduce(rank == n - 1, "OR")
        out["avg"] = ctx.all_reduce(float(rank), "AVERAGE")
        # all_gather: any shapes, every codec type
        out |= gather_rows(ctx)
        out["gather_bf16"] = [x.dtype for x in ctx.all_gather(torch.ones(rank + 2, dtype=torch.bfloat16))]
        out["gather_float"] = ctx.all_gather(5e-324 if rank else -0.0)
        # broadcast: every src, None receivers, in place, big tensors, every dtype
        out |= broadcast_rows(ctx)
        big_bool = torch.arange(100_000) % 3 == 0 if rank == 0 else torch.zeros(100_000, dtype=torch.bool)
        out["bcast_big_bool"] = int(ctx.broadcast(big_bool, 0).sum())
        out["bcast_new"] = ctx.broadcast(torch.tensor([7, 8, 9]) if rank == 0 else None).tolist()
        # groups: lists of ranks, new_group, an hvd.ProcessSet; outsiders get their input back
        out["group_sum"] = ctx.all_reduce(rank + 1, group=[0, n - 1])
        out["group_single"] = ctx.all_reduce(torch.tensor([rank + 1.0]), group=[1]).tolist()
        grp = ctx.new_group([0, 1])
        out["group_gather"] = ctx.all_gather(rank, group=grp)
        out["group_bcast"] = ctx.broadcast(rank * 10, src=1, group=grp)
        import horovod.torch as hvd

        ps = hvd.add_process_set([0])
        out["process_set"] = ctx.all_reduce(torch.tensor([rank + 5.0]), group=ps).tolist()
        ctx.barrier()
        ctx.barrier(group=[0])
        ctx.sync()
        out["after_groups"] = ctx.all_reduce(torch.ones(1)).tolist()
    finally:
        idist.finalize()
    out["hvd_after_finalize"] = hvd.is_initialized()
    return out


def bad_inputs() -> dict[str, Any]:
    """Bad input raises the same typed error on every rank, and the world stays usable."""
    ctx = idist.initialize()
    rank = ctx.rank
    out: dict[str, Any] = {}

    def outcome(key: str, fn: Any) -> None:
        try:
            fn()
            out[key] = ("ok",)
        except Exception as exc:
            out[key] = (type(exc).__name__, str(exc))

    try:
        outcome("unknown_op", lambda: ctx.all_reduce(torch.ones(2), "MEAN"))
        outcome("adasum_int", lambda: ctx.all_reduce(torch.ones(2, dtype=torch.int32), "ADASUM"))
        outcome("adasum_float_value", lambda: ctx.all_reduce(1.0, "ADASUM"))  # type: ignore[call-overload]
        outcome("adasum_group", lambda: ctx.all_reduce(torch.ones(2), "ADASUM", group=[0]))
        outcome("bad_src", lambda: ctx.broadcast(1, src=5))
        outcome("shape_mismatch", lambda: ctx.all_reduce(torch.ones(2 + rank)))
        outcome("dtype_mismatch", lambda: ctx.all_reduce(torch.ones(2, dtype=torch.float32 if rank else torch.float64)))
        outcome("emulated_shape_mismatch", lambda: ctx.all_reduce(torch.ones(2 + rank, dtype=torch.int8), "OR"))
        i32_or_64 = torch.int32 if rank else torch.int64
        outcome("gather_dtype_mismatch", lambda: ctx.all_gather(torch.ones(2, dtype=i32_or_64)))
        outcome("value_type_mismatch", lambda: ctx.all_reduce(True if rank else 1))  # a bool mixes with nothing
        outcome("unpicklable", lambda: ctx.all_gather(lambda: None) if rank == 1 else ctx.all_gather(3))
        outcome("overflow", lambda: ctx.all_reduce(2**62))
        outcome("bad_group", lambda: ctx.all_reduce(1, group=[0, 7]))
        out["still_works"] = ctx.all_reduce(torch.ones(1)).tolist()
    finally:
        idist.finalize()
    return out


def fail_on_rank(bad: int) -> str:
    """Rank ``bad`` raises after the world started; the other waits in a collective."""
    ctx = idist.initialize()
    ctx.all_reduce(torch.ones(1))
    if ctx.rank == bad:
        raise ZeroDivisionError(f"deliberate failure on rank {ctx.rank}")
    ctx.all_reduce(torch.ones(1))  # never completes: the peer is gone
    return "unreachable"


def lifecycle() -> dict[str, Any]:
    """Adoption, finalize, environment restored, closed contexts refuse use."""
    import horovod.torch as hvd

    out: dict[str, Any] = {}
    env_before = dict(os.environ)
    ctx = idist.initialize("horovod", timeout=45)
    out["dyn_env_during"] = os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS")
    out["double_init"] = _err(lambda: idist.initialize("horovod"))
    idist.finalize()
    idist.finalize()  # safe twice
    out["shutdown"] = not hvd.is_initialized()
    out["env_restored"] = dict(os.environ) == env_before
    out["closed"] = _err(lambda: ctx.all_reduce(1))
    out["current_after"] = type(idist.current()).__name__
    # a Horovod the user started is adopted, used, and never shut down by idist
    hvd.init(process_sets="dynamic")
    adopted = idist.current()
    out["adopted"] = (type(adopted).__name__, adopted.rank, adopted.world_size, adopted.config.get("launcher"))
    out["adopted_sum"] = idist.all_reduce(adopted.rank + 1)
    out["adopted_group"] = idist.all_reduce(torch.tensor([1.0]), group=[1]).tolist()
    out["same_adopted"] = idist.current() is adopted
    out["create_while_running"] = _err(lambda: idist.initialize("horovod"))
    idist.finalize()
    out["adopted_alive"] = hvd.is_initialized() and idist.all_reduce(2) == 4
    hvd.shutdown()
    out["serial_after_shutdown"] = type(idist.current()).__name__
    # scoped: context("horovod") after a shutdown initializes afresh and finalizes on exit
    with idist.context("horovod") as scoped:
        out["scoped"] = (type(scoped).__name__, scoped.all_gather(scoped.rank))
    out["scoped_closed"] = scoped.closed and not hvd.is_initialized()
    return out


def _err(fn: Any) -> str:
    try:
        fn()
    except Exception as exc:
        return type(exc).__name__
    return "no error"


def single_process() -> dict[str, Any]:
    """No horovodrun: initialize('horovod') is a world of one."""
    ctx = idist.initialize("horovod")
    try:
        t = torch.ones(2)
        return {
            "world": (ctx.rank, ctx.world_size, ctx.launcher if hasattr(ctx, "launcher") else ctx.config["launcher"]),
            "sum": ctx.all_reduce(t).tolist(),
            "same": ctx.all_reduce(t) is t,
            "gather": ctx.all_gather("x"),
        }
    finally:
        idist.finalize()
