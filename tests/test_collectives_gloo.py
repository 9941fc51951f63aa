"""The collective semantics, row by row, on real gloo processes (2 and 3 ranks, loopback)."""

from __future__ import annotations

import math
import struct
import threading
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import pytest
import torch
from properties._payloads import Bomb, Color, LoadsOnRankZero, Mode, Perm

import idist
from multiproc import run_ranks
from semantics_cases import broadcast_rows, fresh_context, gather_rows


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


# ------------------------------------------------------------------ issue 33
# One launch of 2 real gloo ranks runs every case below, each in a context of its own
# (semantics_cases.fresh_context); each test then checks one row of what came back.
def _outcome(fn: Any) -> tuple[str, Any]:
    try:
        value = fn()
    except idist.IdistError as exc:
        return ("err", type(exc).__name__, str(exc))  # type: ignore[return-value]
    except Exception as exc:  # a raw torch or Python error is a bug here: report it as such
        return ("raw", f"{type(exc).__name__}: {exc}")
    return ("ok", value)


def _nan(payload: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000000 | payload))[0])


def _bits(x: float) -> str:
    return struct.pack("<d", x).hex()


def _issue_cases(rank: int) -> dict[str, Any]:
    import numpy as np

    out: dict[str, Any] = {}

    def case(name: str) -> Any:
        return fresh_context(rank, 2, name)

    # 3: broadcast into parameters and inference tensors, small (inline) and large
    ctx = case("params")
    for n in (3, 40_000):
        p = torch.nn.Parameter(torch.full((n,), float(rank + 1)))
        got = _outcome(lambda p=p: ctx.broadcast(p, 0))
        out[f"bcast_param_{n}"] = (got[0], got[1] is p if got[0] == "ok" else got, p.detach().unique().tolist(),
                                   p.requires_grad, p.grad_fn is None)  # fmt: skip
        with torch.inference_mode():
            it = torch.full((n,), float(rank + 1))
        got = _outcome(lambda it=it: ctx.broadcast(it, 0))
        out[f"bcast_inference_{n}"] = (got[0], it.unique().tolist())
    # 4: AVERAGE of a parameter, contiguous and strided, and of an inference tensor
    for shape in ((3,), (300, 200)):
        p = torch.nn.Parameter(torch.full(shape, float(rank + 1)))
        target = p if len(shape) == 1 else p.t()
        got = _outcome(lambda t=target: ctx.all_reduce(t, "AVERAGE"))
        out[f"avg_param_{len(shape)}"] = (got[0], p.detach().unique().tolist(), p.requires_grad)
    with torch.inference_mode():
        it = torch.full((3,), float(rank + 1))
    out["avg_inference"] = (_outcome(lambda: ctx.all_reduce(it, "AVERAGE"))[0], it.unique().tolist())
    out["params_after"] = _outcome(lambda: ctx.all_gather(rank))
    ctx.close()

    # 6: types survive transit
    ctx = case("types")
    values: dict[str, Any] = {
        "intenum": Color.RED, "strenum": Mode.FAST, "intflag": Perm.R | Perm.W, "bytearray": bytearray(b"\x00ab"),
        "purewindows": PureWindowsPath("C:\\data\\x"), "pureposix": PurePosixPath("/a/b"), "path": Path("/tmp/x"),
        "np_float64": np.float64(0.1), "np_int64": np.int64(7), "bool": True, "bytes": b"ab",
    }  # fmt: skip
    for name, v in values.items():
        b, g = ctx.broadcast(v if rank == 0 else None, 0), ctx.all_gather(v)
        out[f"type_{name}"] = (type(b).__name__, b == v, [type(x).__name__ for x in g], all(x == v for x in g))
    out["type_memoryview"] = _outcome(lambda: ctx.broadcast(memoryview(b"ab") if rank == 0 else None, 0))[:2]
    out["type_memoryview_gather"] = _outcome(lambda: ctx.all_gather(memoryview(b"ab") if rank == 1 else b"ab"))[:2]
    out["types_after"] = _outcome(lambda: ctx.all_gather(rank))
    ctx.close()

    # 7: broadcast of a large tensor the source cannot write
    ctx = case("unwritable")
    src = torch.arange(300 * 200, dtype=torch.float32).reshape(300, 200)
    param = torch.nn.Parameter(src.clone())
    for name, mine in (("expanded", torch.ones(1).expand(40_000)), ("param_t", param.t())):
        placeholder = torch.zeros(mine.shape) if rank == 1 else mine
        got = _outcome(lambda m=placeholder: ctx.broadcast(m, 0))
        out[f"unwritable_{name}"] = (got[0], got[1].tolist() == mine.tolist() if got[0] == "ok" else got)
    recv = torch.zeros(1).expand(40_000)  # a receiver's placeholder that cannot be written either
    got = _outcome(lambda: ctx.broadcast(torch.ones(40_000) if rank == 0 else recv, 0))
    out["unwritable_receiver"] = (got[0], float(got[1].sum()) if got[0] == "ok" else got, float(recv.sum()))
    out["unwritable_reduce"] = _outcome(lambda: ctx.all_reduce(torch.ones(1).expand(4)))[:2]
    out["unwritable_after"] = _outcome(lambda: ctx.all_gather(rank))
    ctx.close()

    # 8: conjugated complex tensors
    ctx = case("conj")
    for dtype in (torch.complex64, torch.complex128):
        base = torch.full((4,), complex(rank + 1, rank + 2), dtype=dtype)
        view = base.conj()
        got = _outcome(lambda v=view: ctx.all_reduce(v))
        out[f"conj_{dtype}"] = (got[0], got[1] is view if got[0] == "ok" else got, view.tolist())
    out["conj_gather"] = _outcome(lambda: [t.tolist() for t in ctx.all_gather(torch.tensor([1 + 2j]).conj())])
    out["conj_after"] = _outcome(lambda: ctx.all_gather(rank))
    ctx.close()

    # 9: NaN payloads: every mode of the number sum (pair, float, gather on 2 ranks)
    ctx = case("nan")
    out["nan_bits"] = [_bits(ctx.all_reduce(_nan(1 + rank) if step != 1 else 0.5 * (rank + 1))) for step in range(4)]
    ctx.close()

    # 10: a payload that fails to unpickle
    ctx = case("unpickle")
    out["unpickle_bcast"] = _outcome(lambda: ctx.broadcast(Bomb() if rank == 0 else None, 0))[:2]
    out["unpickle_gather"] = _outcome(lambda: ctx.all_gather(Bomb() if rank == 1 else "fine"))[:2]
    # ... and one that loads on src only: unchecked, the ranks that cannot load it raise alone
    out["loads_on_src_bcast"] = _outcome(lambda: type(ctx.broadcast(LoadsOnRankZero() if rank == 0 else None, 0)))
    out["loads_on_src_gather"] = _outcome(
        lambda: [type(v) for v in ctx.all_gather(LoadsOnRankZero() if rank == 0 else "")]
    )
    out["loads_on_src_after"] = _outcome(lambda: ctx.all_gather(rank))
    out["unpicklable_src1"] = _outcome(lambda: ctx.broadcast(threading.Lock() if rank == 1 else None, 1))
    out["unpickle_value"] = _outcome(lambda: ctx.all_gather(idist.CollectiveInputError("a value, not an error")))
    out["unpickle_after"] = _outcome(lambda: ctx.all_gather(rank))
    ctx.close()
    # checked mode confirms a pickle in one more round: src may not return while the others raise
    ctx = fresh_context(rank, 2, "unpickle-checked", checked=True)
    out["checked_loads_on_src_bcast"] = _outcome(lambda: ctx.broadcast(LoadsOnRankZero() if rank == 0 else None, 0))
    out["checked_loads_on_src_gather"] = _outcome(lambda: ctx.all_gather(LoadsOnRankZero() if rank == 0 else "f"))
    out["checked_loads_on_src_after"] = _outcome(lambda: ctx.all_gather(rank))
    ctx.close()

    # 11: numpy scalars, and ints mixed with floats (issue 35, item 4)
    ctx = case("numpy")
    for name, v in {
        "i64": np.int64(rank + 3), "f32": np.float32(0.5 + rank), "f64": np.float64(0.1 * (rank + 1)),
        "bool_or": np.bool_(rank == 1), "i32_max": np.int32(2**31 - 1),
    }.items():  # fmt: skip
        got = _outcome(lambda v=v, name=name: ctx.all_reduce(v, "OR" if name == "bool_or" else "SUM"))
        out[f"np_{name}"] = (got[0], type(got[1]).__name__, got[1].item() if hasattr(got[1], "item") else got[1])
    out["np_mixed"] = _outcome(lambda: ctx.all_reduce(np.int64(2) if rank == 0 else 3))
    for name, v in {"f32": np.float32(1.5 + rank), "i64": np.int64(3 + rank)}.items():  # AVERAGE keeps a float type
        got = _outcome(lambda v=v: ctx.all_reduce(v, "AVERAGE"))
        out[f"np_avg_{name}"] = (got[0], type(got[1]).__name__, got[1].item() if hasattr(got[1], "item") else got[1])
    for i in range(3):  # the pair, then the gather, then the pair again
        got = _outcome(lambda: ctx.all_reduce(0 if rank == 0 else 1.5))
        out[f"int_float_{i}"] = (got[0], type(got[1]).__name__, got[1])
    out["int_float_avg"] = _outcome(lambda: ctx.all_reduce(1 if rank == 0 else 2.0, "AVERAGE"))
    out["int_avg"] = _outcome(lambda: ctx.all_reduce(rank, "AVERAGE"))
    out["numpy_after"] = _outcome(lambda: ctx.all_gather(rank))
    ctx.close()

    # 12: scratch memory and the agreed slot after an outsized call
    ctx = case("scratch")
    comm = ctx._state.world
    ctx.all_gather(b"x" * 40_000_000)
    ctx.broadcast(b"y" * 40_000_000 if rank == 0 else None, 0)
    ctx.all_gather(rank)
    out["scratch_bytes"] = sum(b.numel() for b in comm.scratch.values())
    out["scratch_slot"] = comm.lockstep.slot
    ctx.close()
    return out


@pytest.fixture(scope="module")
def issue_rows() -> list[dict[str, Any]]:
    return run_ranks(_issue_cases, 2, timeout=180)  # type: ignore[no-any-return]


def test_broadcast_fills_parameters_and_inference_tensors(issue_rows: list[dict[str, Any]]) -> None:
    for rank, r in enumerate(issue_rows):
        for n in (3, 40_000):
            assert r[f"bcast_param_{n}"] == ("ok", True, [1.0], True, True), (rank, n, r[f"bcast_param_{n}"])
            assert r[f"bcast_inference_{n}"] == ("ok", [1.0]), (rank, n, r[f"bcast_inference_{n}"])


def test_average_of_a_parameter_is_the_mean_in_place(issue_rows: list[dict[str, Any]]) -> None:
    for r in issue_rows:
        assert r["avg_param_1"] == ("ok", [1.5], True), r["avg_param_1"]
        assert r["avg_param_2"] == ("ok", [1.5], True), r["avg_param_2"]
        assert r["avg_inference"] == ("ok", [1.5]), r["avg_inference"]
        assert r["params_after"] == ("ok", [0, 1]), r["params_after"]


def test_types_survive_broadcast_and_all_gather(issue_rows: list[dict[str, Any]]) -> None:
    expected = {
        "intenum": "Color", "strenum": "Mode", "intflag": "Perm", "bytearray": "bytearray",
        "purewindows": "PureWindowsPath", "pureposix": "PurePosixPath", "path": "PosixPath",
        "np_float64": "float64", "np_int64": "int64", "bool": "bool", "bytes": "bytes",
    }  # fmt: skip
    for r in issue_rows:
        for name, cls in expected.items():
            assert r[f"type_{name}"] == (cls, True, [cls, cls], True), (name, r[f"type_{name}"])
        # a memoryview cannot come back as one: refused on every rank, the group usable
        assert r["type_memoryview"] == ("err", "UnsupportedValueError"), r["type_memoryview"]
        assert r["type_memoryview_gather"] == ("err", "UnsupportedValueError"), r["type_memoryview_gather"]
        assert r["types_after"] == ("ok", [0, 1]), r["types_after"]


def test_broadcast_never_writes_into_the_source_tensor(issue_rows: list[dict[str, Any]]) -> None:
    for rank, r in enumerate(issue_rows):
        assert r["unwritable_expanded"] == ("ok", True), (rank, r["unwritable_expanded"])
        assert r["unwritable_param_t"] == ("ok", True), (rank, r["unwritable_param_t"])
        # a receiver whose tensor cannot be written gets a new one
        assert r["unwritable_receiver"] == ("ok", 40_000.0, 0.0), r["unwritable_receiver"]
        assert r["unwritable_reduce"] == ("err", "UnsupportedValueError"), r["unwritable_reduce"]
        assert r["unwritable_after"] == ("ok", [0, 1]), r["unwritable_after"]


def test_all_reduce_of_a_conjugated_view(issue_rows: list[dict[str, Any]]) -> None:
    for r in issue_rows:
        for dtype in (torch.complex64, torch.complex128):
            # the view's values are conj(base): (1-2j) and (2-3j) summed
            assert r[f"conj_{dtype}"] == ("ok", True, [3 - 5j] * 4), (dtype, r[f"conj_{dtype}"])
        assert r["conj_gather"] == ("ok", [[1 - 2j]] * 2), r["conj_gather"]
        assert r["conj_after"] == ("ok", [0, 1]), r["conj_after"]


def test_nan_payloads_are_the_rank_order_folds_bits_on_every_rank(issue_rows: list[dict[str, Any]]) -> None:
    fold = _bits(_nan(1) + _nan(2))  # what Python's left fold in rank order gives
    assert issue_rows[0]["nan_bits"] == issue_rows[1]["nan_bits"]
    assert issue_rows[0]["nan_bits"] == [fold, _bits(0.5 + 1.0), fold, fold]


def test_a_payload_that_does_not_unpickle_raises_on_every_rank(issue_rows: list[dict[str, Any]]) -> None:
    for r in issue_rows:
        assert r["unpickle_bcast"] == ("err", "UnsupportedValueError"), r["unpickle_bcast"]
        assert r["unpickle_gather"] == ("err", "UnsupportedValueError"), r["unpickle_gather"]
    for call in ("bcast", "gather"):  # loads on rank 0 only
        # unchecked: no round confirms it, rank 1 raises alone and the next call pairs right
        rank0, rank1 = (r[f"loads_on_src_{call}"] for r in issue_rows)
        assert rank0 == ("ok", LoadsOnRankZero if call == "bcast" else [int, str]), rank0  # it loads as 42
        assert rank1[:2] == ("err", "UnsupportedValueError"), rank1
        # checked: every rank raises the same
        got = [r[f"checked_loads_on_src_{call}"] for r in issue_rows]
        assert got[0] == got[1] and got[0][:2] == ("err", "UnsupportedValueError"), got
        assert "rank 1 could not load it" in got[0][2], got
    for r in issue_rows:
        assert r["loads_on_src_after"] == ("ok", [0, 1]), r["loads_on_src_after"]
        assert r["checked_loads_on_src_after"] == ("ok", [0, 1]), r["checked_loads_on_src_after"]
        got = r["unpicklable_src1"]  # the error names src, whatever its place in the group
        assert got[:2] == ("err", "UnsupportedValueError") and "failed on rank 1" in got[2], got
        # an exception object is a value like any other
        got = r["unpickle_value"]
        assert got[0] == "ok" and [type(e).__name__ for e in got[1]] == ["CollectiveInputError"] * 2, got
        assert r["unpickle_after"] == ("ok", [0, 1]), r["unpickle_after"]


def test_numpy_scalars_reduce_like_the_python_numbers_they_stand_for(issue_rows: list[dict[str, Any]]) -> None:
    for r in issue_rows:
        assert r["np_i64"] == ("ok", "int64", 7)
        assert r["np_f32"] == ("ok", "float32", 2.0)
        assert r["np_f64"] == ("ok", "float64", 0.1 + 0.2)
        assert r["np_bool_or"] == ("ok", "bool", True)
        assert r["np_i32_max"][0] == "err" and r["np_i32_max"][2] == "ReduceOverflowError", r["np_i32_max"]
        assert r["np_mixed"] == ("ok", 5) and type(r["np_mixed"][1]) is int
        assert r["np_avg_f32"] == ("ok", "float32", 2.0) and r["np_avg_i64"] == ("ok", "float", 3.5)
        # an int on one rank and a float on another reduce as floats, the same on every rank
        assert [r[f"int_float_{i}"] for i in range(3)] == [("ok", "float", 1.5)] * 3
        assert r["int_float_avg"] == ("ok", 1.5)
        assert r["int_avg"] == ("ok", 0.5) and type(r["int_avg"][1]) is float  # a float variable may hold ints
        assert r["numpy_after"] == ("ok", [0, 1]), r["numpy_after"]


def test_scratch_memory_returns_to_normal_after_an_outsized_call(issue_rows: list[dict[str, Any]]) -> None:
    for r in issue_rows:
        assert r["scratch_bytes"] <= 16 << 20, r["scratch_bytes"]
        assert r["scratch_slot"] <= 1 << 20, r["scratch_slot"]
