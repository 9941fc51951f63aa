"""Regressions the property suite found on XLA CPU device threads: every replica must run the
same compiled program for a collective (else they never meet, and XLA aborts the process
after 10 s), and a repeated collective must reuse its program.

Runs in the XLA lane; skipped where torch_xla is not installed.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch

if importlib.util.find_spec("torch_xla") is None:
    pytest.skip("torch_xla is not installed (the XLA lane runs these)", allow_module_level=True)

import idist
from idist.testing._xla_world import XlaWorld

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"xla@{n}")
def world(request: pytest.FixtureRequest) -> Iterator[XlaWorld]:
    w = XlaWorld(request.param, timeout=120)
    yield w
    w.close()


def scalars(ctx: idist.DistContext) -> dict[str, Any]:
    r = ctx.rank
    out: dict[str, Any] = {}
    # 0-dim inputs whose values (0, 1, or equal to a constant of the program) differ per rank
    out["sum"] = ctx.all_reduce(torch.tensor(1 if r == ctx.world_size - 1 else 0, dtype=torch.int32)).item()
    out["avg"] = ctx.all_reduce(torch.tensor(2.0 * r), "AVERAGE").item()
    out["min"] = ctx.all_reduce(torch.tensor(math.nan if r == 0 else 1.0), "MIN").item()
    out["max"] = ctx.all_reduce(torch.tensor([float(r), math.nan if r == 1 else 0.0]), "MAX").tolist()
    out["and_empty"] = tuple(ctx.all_reduce(torch.zeros(0, dtype=torch.int32), "AND").shape)
    out["and"] = ctx.all_reduce(torch.tensor(6 + r, dtype=torch.int64), "AND").item()
    out["complex"] = ctx.all_reduce(torch.tensor([1 + 2j * (r + 1)], dtype=torch.complex128)).tolist()
    got = ctx.broadcast(torch.tensor(1.5 - 2.5j, dtype=torch.complex128) if r == 0 else None, 0)
    out["bcast_c128"] = (got.item(), got.device.type)
    out["one"] = [ctx.all_reduce(5 + r, group=[1]), ctx.all_gather(r, group=[1]), ctx.all_reduce(1)]
    return out


def test_rank_dependent_scalars_still_meet(world: XlaWorld) -> None:
    n = world.world_size
    for r, res in enumerate(world.run(scalars)):
        assert res["sum"] == 1
        assert res["avg"] == sum(2.0 * k for k in range(n)) / n
        assert math.isnan(res["min"])
        assert res["max"][0] == n - 1 and math.isnan(res["max"][1])
        assert res["and_empty"] == (0,)
        expected_and = 6
        for k in range(1, n):
            expected_and &= 6 + k
        assert res["and"] == expected_and
        assert res["complex"] == [complex(n, 2 * sum(range(1, n + 1)))]
        assert res["bcast_c128"] == (1.5 - 2.5j, "cpu")  # exact, so on the CPU (see _receive_device)
        assert res["one"] == [5 + r, [r] if r != 1 else [1], n]


def repeated(ctx: idist.DistContext, rounds: int) -> list[int]:
    import torch_xla.debug.metrics as met

    compiles = []
    for _ in range(rounds):
        before = met.counter_value("UncachedCompile") or 0
        for shape in ((3,), (2, 5), (7,)):
            ctx.all_reduce(torch.ones(shape))
            ctx.all_reduce(torch.ones(shape, dtype=torch.float64), "MAX")
        ctx.all_gather("x" * 10)
        ctx.broadcast(torch.arange(300.0) if ctx.rank == 0 else torch.zeros(300), 0)
        compiles.append((met.counter_value("UncachedCompile") or 0) - before)
    return compiles


def test_a_repeated_collective_reuses_its_program(world: XlaWorld) -> None:
    # the first round compiles (the counter is per process: all threads count), the second
    # may still compile once (the byte exchange settles its slot size); from then on every
    # program comes from the cache (before the token reset, every call compiled anew)
    for compiles in world.run(repeated, 4):
        assert compiles[0] > 0 and compiles[1] <= 2 and compiles[2:] == [0, 0], compiles
