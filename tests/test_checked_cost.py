"""What checked mode costs and changes: one small collective more per call, the same result.

Checked mode compares each call across ranks before data moves; the result must be the
unchecked call's, bit for bit, and the check must be the only collective it adds.
Simulated gloo ranks (threads); the count is the world comm's collective counter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from idist import NativeContext
from idist.testing import simulate

Call = Callable[[NativeContext], Any]


def _bits(x: object) -> object:
    if isinstance(x, torch.Tensor):
        return (x.dtype, tuple(x.shape), bytes(x.contiguous().view(torch.uint8).reshape(-1).tolist()))
    if isinstance(x, list):
        return [_bits(v) for v in x]
    return (type(x).__name__, repr(x))


def _tensor(rank: int, dtype: torch.dtype, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    if dtype.is_floating_point:
        t = torch.randn(n, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-30, 30, (n,), generator=g)
        t[:3] = torch.tensor([-0.0, 0.0, float("inf") if rank else -0.0])[: min(3, n)]
        return t.to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (n,), generator=g, dtype=torch.int64).to(dtype)


def _run(ctx: NativeContext, call: Call) -> tuple[object, int]:
    comm = ctx._state.world
    before = comm.lockstep.seq
    got = call(ctx)
    return _bits(got), comm.lockstep.seq - before


def _both(world_size: int, call: Call) -> tuple[list[tuple[object, int]], list[tuple[object, int]]]:
    return simulate(world_size, _run, call, checked=False), simulate(world_size, _run, call, checked=True)


CALLS: dict[str, tuple[int, Call]] = {
    "float32 SUM": (2, lambda c: c.all_reduce(_tensor(c.rank, torch.float32, 100))),
    "float32 SUM, 3 ranks": (3, lambda c: c.all_reduce(_tensor(c.rank, torch.float32, 100))),
    "float64 PRODUCT": (2, lambda c: c.all_reduce(_tensor(c.rank, torch.float64, 100), "PRODUCT")),
    "float32 AVERAGE": (2, lambda c: c.all_reduce(_tensor(c.rank, torch.float32, 7), "AVERAGE")),
    "float64 MAX": (2, lambda c: c.all_reduce(_tensor(c.rank, torch.float64, 10), "MAX")),
    "int8 SUM wraps, 3 ranks": (3, lambda c: c.all_reduce(_tensor(c.rank, torch.int8, 50))),
    "int64 PRODUCT, 3 ranks": (3, lambda c: c.all_reduce(_tensor(c.rank, torch.int64, 50), "PRODUCT")),
    "int64 large": (2, lambda c: c.all_reduce(_tensor(c.rank, torch.int64, 100_000))),
    "strided tensor": (2, lambda c: c.all_reduce(_tensor(c.rank, torch.int64, 20)[::2])),
    "Python float sum": (3, lambda c: c.all_reduce(0.1 * (c.rank + 1))),
    "Python float sum, 2 ranks": (2, lambda c: c.all_reduce(0.1 * (c.rank + 1))),
    "Python int MAX": (2, lambda c: c.all_reduce(c.rank - 7, "MAX")),
    "bool OR": (2, lambda c: c.all_reduce(c.rank == 1, "OR")),
    "all_gather tensors": (3, lambda c: c.all_gather(_tensor(c.rank, torch.float32, 1000))),
    "all_gather shapes differ": (2, lambda c: c.all_gather(torch.arange(c.rank + 2))),
    "all_gather str": (2, lambda c: c.all_gather("r" * c.rank)),
    "broadcast str": (2, lambda c: c.broadcast("hello" if c.rank == 1 else None, src=1)),
    "broadcast tensor to None": (3, lambda c: c.broadcast(torch.arange(5.0) if c.rank == 0 else None)),
}


@pytest.mark.parametrize("name", CALLS)
def test_a_checked_call_is_the_unchecked_call_plus_one_collective(name: str) -> None:
    world_size, call = CALLS[name]
    plain, checked = _both(world_size, call)
    assert [bits for bits, _ in checked] == [bits for bits, _ in plain]
    assert [n for _, n in checked] == [n + 1 for _, n in plain]


def test_a_checked_barrier_is_its_check_alone() -> None:
    plain, checked = _both(2, lambda c: c.barrier())
    assert [n for _, n in plain] == [n for _, n in checked] == [1, 1]


def _in_place(ctx: NativeContext) -> list[bool]:
    mine = torch.full((4,), float(ctx.rank))
    got = ctx.broadcast(mine, src=0)
    summed = torch.full((3,), ctx.rank + 1, dtype=torch.int64)
    return [got is mine, bool((got == 0).all()), ctx.all_reduce(summed) is summed, summed.tolist() == [3] * 3]


def test_checked_results_land_in_the_callers_tensors() -> None:
    assert simulate(2, _in_place) == [[True, True, True, True]] * 2
