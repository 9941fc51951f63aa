"""The collective semantics on 2 real Horovod ranks (horovodrun --gloo, loopback)."""

from __future__ import annotations

import functools
import math
import operator
from pathlib import Path
from typing import Any

import pytest
import torch
from cases import DTYPES, _inputs
from hvdrun import hvdrun

N = 2


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return hvdrun("cases:rows", N, timeout=300)


def valid_ops(dtype: torch.dtype) -> tuple[str, ...]:
    if dtype == torch.bool:
        return ("MIN", "MAX", "AND", "OR")
    if dtype.is_complex:
        return ("SUM", "AVERAGE")
    if dtype.is_floating_point:
        return ("SUM", "PRODUCT", "MIN", "MAX", "AVERAGE")
    return ("SUM", "PRODUCT", "MIN", "MAX", "AND", "OR")


def reference(dtype: torch.dtype, op: str) -> torch.Tensor:
    """the contract's meaning of ``op`` over the ranks' inputs, computed without idist or Horovod."""
    ts = [_inputs(dtype, r) for r in range(N)]
    if dtype.is_floating_point or dtype.is_complex:
        wide = torch.complex128 if dtype.is_complex else torch.float64
        acc = ts[0].to(wide)
        for t in ts[1:]:
            acc = {
                "SUM": lambda a, b: a + b, "AVERAGE": lambda a, b: a + b, "PRODUCT": lambda a, b: a * b,
                "MIN": torch.minimum, "MAX": torch.maximum,
            }[op](acc, t.to(wide))  # fmt: skip
        return (acc / N if op == "AVERAGE" else acc).to(dtype)
    # integers and bool elementwise in Python (inputs are small: nothing wraps)
    rows = [[int(v) for v in t.reshape(-1).tolist()] for t in ts]
    fold = {
        "SUM": sum, "PRODUCT": math.prod, "MIN": min, "MAX": max,
        "AND": lambda vs: functools.reduce(operator.and_, vs), "OR": lambda vs: functools.reduce(operator.or_, vs),
    }[op]  # fmt: skip
    flat = [fold(list(col)) for col in zip(*rows, strict=True)]
    return torch.tensor([bool(v) for v in flat] if dtype == torch.bool else flat, dtype=dtype).reshape(ts[0].shape)


def test_context_and_queries(results: list[dict[str, Any]]) -> None:
    for rank, r in enumerate(results):
        assert (r["type"], r["backend"], r["model"]) == ("HorovodContext", "horovod", "horovod-dist")
        assert r["topology"] == (rank, N, rank, N, 0, 1)
        assert r["module_queries"] == (rank, N, "horovod", "cpu")


def test_every_dtype_and_op_in_place(results: list[dict[str, Any]]) -> None:
    for dtype in DTYPES:
        for op in ("SUM", "PRODUCT", "MIN", "MAX", "AVERAGE", "AND", "OR"):
            key = f"{dtype}/{op}"
            got = [r["reduced"][key] for r in results]
            if op not in valid_ops(dtype):
                assert all(g[0] == "rejected" and "valid ops" in g[1] for g in got), (key, got)
                continue
            want = reference(dtype, op)
            values = []
            for rank, g in enumerate(got):
                assert g[0] == "ok" and g[1] is True and g[2] == dtype, (key, rank, g)
                shape, data = g[3]
                values.append(data)
                value = data.view(dtype).reshape(shape)
                if dtype.is_complex:
                    torch.testing.assert_close(value, want, msg=key)
                else:
                    assert value.dtype == want.dtype and bytes(data.tolist()) == bytes(
                        want.contiguous().reshape(-1).view(torch.uint8).tolist()
                    ), (key, rank, value, want)
            assert torch.equal(values[0], values[1]), key  # the same bits on every rank


def test_tensor_rows(results: list[dict[str, Any]]) -> None:
    for r in results:
        assert r["tensor_inplace"] == (True, [3.0, 3.0, 3.0])
        assert r["noncontig"] == ([[0.0, 6.0], [2.0, 8.0], [4.0, 10.0]], False)
        assert r["empty"] == (0,)
        assert r["after_groups"] == [2.0]


def _adasum_pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    dot = float(a @ b)
    na, nb = float(a @ a), float(b @ b)
    return (1 - dot / (2 * na)) * a + (1 - dot / (2 * nb)) * b


def test_adasum_matches_the_published_formula(results: list[dict[str, Any]]) -> None:
    a, b = (_inputs(torch.float64, r).reshape(-1) for r in range(N))
    want = _adasum_pair(a, b)
    for r in results:
        same, got = r["adasum"]
        assert same is True
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # orthogonal inputs add up, identical inputs stay (Adasum's defining properties)
    e0, e1 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])
    assert torch.equal(_adasum_pair(e0, e1), e0 + e1)
    assert torch.equal(_adasum_pair(e1, e1), e1)


def test_python_values_are_exact(results: list[dict[str, Any]]) -> None:
    for r in results:
        assert r["int"] == 2 * 2**53 + 1 and type(r["int"]) is int
        assert r["float"] == 0.1 + 0.2 and type(r["float"]) is float
        assert r["float_max"] == 1e300
        assert r["bool_any"] is True
        assert r["avg"] == 0.5


def test_all_gather_rows(results: list[dict[str, Any]]) -> None:
    for r in results:
        assert r["gather_shapes"] == [(1, 1), (1, 2)]
        assert r["gather_vals"] == [[[0]], [[0, 1]]]
        assert r["gather_bf16"] == [torch.bfloat16] * N
        assert r["gather_str"] == ["héllo✓\U0001f600" * (1 + k * 3000) + "\ud800" for k in range(N)]
        assert r["gather_bytes"] == [bytes(range(256)) * k for k in range(N)]
        assert r["gather_int"] == [2**100, 2**101]
        assert math.copysign(1, r["gather_float"][0]) == -1 and r["gather_float"][1] == 5e-324
        assert r["gather_path"] == [Path("/tmp/r0"), Path("/tmp/r1")]
        assert r["gather_obj"] == [{"rank": 0, "list": []}, {"rank": 1, "list": [1]}]


def test_broadcast_rows(results: list[dict[str, Any]]) -> None:
    for r in results:
        assert [r[f"bcast_py_{s}"] for s in range(N)] == [1e300, 1e300 + 1]
        assert r["bcast_big"] == (True, float(sum(range(100_000))))
        assert r["bcast_big_bool"] == len(range(0, 100_000, 3))
        assert r["bcast_new"] == [7, 8, 9]
        assert r["bcast_str"] == "ünïcode✓" * 5000
        assert r["bcast_int"] == 2**63 - 1


def test_groups_and_process_sets(results: list[dict[str, Any]]) -> None:
    r0, r1 = results
    assert r0["group_sum"] == r1["group_sum"] == 3
    assert r0["group_single"] == [1.0] and r1["group_single"] == [2.0]  # rank 0 outside: input back
    assert r0["group_gather"] == r1["group_gather"] == [0, 1]
    assert r0["group_bcast"] == r1["group_bcast"] == 10
    assert r0["process_set"] == [5.0] and r1["process_set"] == [6.0]
    assert r0["hvd_after_finalize"] is False and r1["hvd_after_finalize"] is False
