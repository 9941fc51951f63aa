"""The collective semantics, row by row, on real gloo processes (2 and 3 ranks, loopback)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

import idist
from multiproc import run_ranks
from semantics_cases import broadcast_rows, gather_rows


def _rows(rank: int) -> dict[str, Any]:
    """Runs on every rank; returns what each collective gave this rank."""
    ctx = idist.initialize("gloo", timeout=60)
    n = ctx.world_size
    out: dict[str, Any] = {}
    try:
        t = torch.full((3,), float(rank + 1))
        same = ctx.all_reduce(t)
        out["tensor_sum"] = t.tolist()
        out["tensor_inplace"] = same is t
        for op in ("SUM", "PRODUCT", "MIN", "MAX", "AVERAGE"):
            out[f"f64_{op}"] = ctx.all_reduce(torch.tensor([rank + 0.5], dtype=torch.float64), op).item()
        i32 = torch.tensor([rank + 1, 6], dtype=torch.int32)
        ctx.all_reduce(i32, "AND")
        out["i32_and"] = (i32.tolist(), i32.dtype)
        flags = torch.tensor([True, rank == 0])
        out["bool_or"] = ctx.all_reduce(flags.clone(), "OR").tolist()
        out["bool_and"] = ctx.all_reduce(flags.clone(), "AND").tolist()
        nc = torch.arange(6.0).reshape(2, 3).t()  # non-contiguous
        ctx.all_reduce(nc)
        out["noncontig"] = nc.tolist()
        out["empty"] = ctx.all_reduce(torch.empty(0)).shape
        # Python numbers: exact, typed back
        out["int"] = ctx.all_reduce(2**53 + rank)
        out["float"] = ctx.all_reduce(0.1 * (rank + 1))
        out["float_max"] = ctx.all_reduce(1e300 if rank == 0 else -0.0, "MAX")
        out["bool_any"] = ctx.all_reduce(rank == n - 1, "OR")
        out["int_product"] = ctx.all_reduce(rank + 2, "PRODUCT")
        # all_gather: tensors of different shapes, values of every codec type
        out |= gather_rows(ctx)
        out["gather_scalar_t"] = [x.item() for x in ctx.all_gather(torch.tensor(rank * 1.5))]
        out["gather_float"] = ctx.all_gather(float("nan") if rank == 0 else 5e-324)
        out["gather_bool"] = ctx.all_gather(rank % 2 == 0)
        # broadcast: every src, None receivers, in place when shapes match
        out |= broadcast_rows(ctx)
        small = torch.tensor([7, 8, 9]) if rank == 0 else None
        got_small = ctx.broadcast(small, 0)
        out["bcast_small"] = got_small.tolist()
        wrong_shape = torch.zeros(2)
        got_ws = ctx.broadcast(torch.ones(5) if rank == 0 else wrong_shape, 0)
        out["bcast_new_tensor"] = (got_ws is wrong_shape, got_ws.tolist(), wrong_shape.tolist())
        out["bcast_bool"] = ctx.broadcast(True if rank == 0 else None)
        out["bcast_safe"] = ctx.broadcast(0.1 if rank == 0 else None, safe_mode=True)
        # groups: list of ranks, new_group; non-members get their input back
        members = [0, n - 1]
        out["group_sum"] = ctx.all_reduce(rank + 1, group=members)
        grp = ctx.new_group([0, 1])
        out["group_gather"] = ctx.all_gather(rank, group=grp)
        out["group_bcast"] = ctx.broadcast(rank * 10, src=1, group=grp)
        ctx.barrier()
        ctx.sync()
        ctx.barrier(group=[0, 1])
    finally:
        idist.finalize()
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_every_row_of_the_contract(n: int) -> None:
    results = run_ranks(_rows, n)
    total = sum(range(1, n + 1))
    for rank, r in enumerate(results):
        assert r["tensor_sum"] == [float(total)] * 3
        assert r["tensor_inplace"]
        halves = [k + 0.5 for k in range(n)]
        assert r["f64_SUM"] == sum(halves)
        assert r["f64_PRODUCT"] == math.prod(halves)
        assert r["f64_MIN"] == 0.5 and r["f64_MAX"] == n - 0.5
        assert r["f64_AVERAGE"] == pytest.approx(sum(halves) / n)
        expect_and = 1
        for k in range(1, n):
            expect_and &= k + 1
        assert r["i32_and"] == ([expect_and, 6], torch.int32)
        assert r["bool_or"] == [True, True] and r["bool_and"] == [True, False]
        assert r["noncontig"] == [[0.0 * n, 3.0 * n], [1.0 * n, 4.0 * n], [2.0 * n, 5.0 * n]]
        assert r["empty"] == (0,)
        assert r["int"] == n * 2**53 + sum(range(n)) and type(r["int"]) is int
        assert r["float"] == sum_left(0.1 * (k + 1) for k in range(n)) and type(r["float"]) is float
        assert r["float_max"] == 1e300
        assert r["bool_any"] is True
        assert r["int_product"] == math.prod(k + 2 for k in range(n))
        assert r["gather_shapes"] == [(1, k + 1) for k in range(n)]
        assert r["gather_vals"] == [[list(range(k + 1))] for k in range(n)]
        assert r["gather_scalar_t"] == [k * 1.5 for k in range(n)]
        assert r["gather_str"] == ["héllo✓\U0001f600" * (1 + k * 3000) + "\ud800" for k in range(n)]
        assert r["gather_bytes"] == [bytes(range(256)) * k for k in range(n)]
        assert r["gather_int"] == [2**100 * (k + 1) for k in range(n)]
        assert math.isnan(r["gather_float"][0]) and r["gather_float"][1:] == [5e-324] * (n - 1)
        assert r["gather_bool"] == [k % 2 == 0 for k in range(n)]
        assert r["gather_path"] == [Path(f"/tmp/r{k}") for k in range(n)]
        assert r["gather_obj"] == [{"rank": k, "list": [k] * k} for k in range(n)]
        for src in range(n):
            assert r[f"bcast_py_{src}"] == 1e300 + src
        assert r["bcast_big"] == (True, float(sum(range(100_000))))
        assert r["bcast_small"] == [7, 8, 9]
        assert r["bcast_new_tensor"][1] == [1.0] * 5
        if rank != 0:
            assert r["bcast_new_tensor"][0] is False and r["bcast_new_tensor"][2] == [0.0, 0.0]
        assert r["bcast_str"] == "ünïcode✓" * 5000
        assert r["bcast_int"] == 2**63 - 1 and r["bcast_bool"] is True and r["bcast_safe"] == 0.1
        assert r["group_sum"] == (1 + n if rank in (0, n - 1) else rank + 1)
        assert r["group_gather"] == ([0, 1] if rank < 2 else [rank])
        assert r["group_bcast"] == (10 if rank < 2 else rank * 10)


def sum_left(values: Any) -> float:
    acc = None
    for v in values:
        acc = v if acc is None else acc + v
    return float(acc)  # type: ignore[arg-type]
