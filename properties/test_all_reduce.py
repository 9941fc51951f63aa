"""``all_reduce(t: Tensor)`` and the ops row, on every runner."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

from idist import DistContext
from idist.testing import Runner

from ._support import (
    MOVE_DTYPES,
    OPS,
    REDUCE_DTYPES,
    equal_values,
    fold_tensors,
    make_tensor,
    outcome,
    random_bits,
    raw,
    same_error_everywhere,
    shapes,
    tensor_values,
    valid_ops,
)


# ------------------------------------------------------------------ rank side
def reduce_in_place(ctx: DistContext, inputs: list[torch.Tensor], op: Any, view: str) -> dict[str, Any]:
    """Reduce this rank's input; report what the call returned and what happened to the input."""
    base = inputs[ctx.rank].clone()
    # the same logical tensor, contiguous or as a strided view (dims reversed in memory)
    rev = list(reversed(range(base.dim())))
    t = base if view == "contiguous" else base.permute(rev).contiguous().permute(rev)
    before, strides = t.data_ptr(), t.stride()
    out = ctx.all_reduce(t, op)
    return {
        "same_object": out is t,
        "same_memory": t.data_ptr() == before,
        "dtype": out.dtype,
        "shape": tuple(out.shape),
        "device": out.device.type,
        "strides_kept": t.stride() == strides,
        "value": t.clone(),
    }


def reduce_bits(ctx: DistContext, dtype: torch.dtype, shape: tuple[int, ...], seed: int, op: Any) -> bytes:
    t = random_bits(dtype, shape, seed + ctx.rank)
    ctx.all_reduce(t, op)
    return raw(t)


def reduce_outcome(ctx: DistContext, dtype: torch.dtype, op: Any) -> tuple[str, object]:
    return outcome(lambda: ctx.all_reduce(torch.ones(3, dtype=dtype), op))


# ------------------------------------------------------------------ properties
@st.composite
def reduce_case(draw: st.DrawFn, world_size: int) -> tuple[torch.dtype, str, list[torch.Tensor], str]:
    dtype = draw(st.sampled_from(REDUCE_DTYPES))
    op = draw(st.sampled_from(valid_ops(dtype)))
    shape = draw(shapes())
    n = 1
    for side in shape:
        n *= side
    per_rank = [
        make_tensor(dtype, shape, draw(st.lists(tensor_values(dtype), min_size=n, max_size=n)))
        for _ in range(world_size)
    ]
    view = draw(st.sampled_from(["contiguous", "strided"]))
    return dtype, op, per_rank, view


@given(data=st.data())
def test_tensor_all_reduce_is_the_reference_fold_in_place(runner: Runner, data: st.DataObject) -> None:
    """Every (dtype, valid op): the result equals the contract's elementwise fold on every rank, lands
    in the input tensor, which is returned itself, with dtype, shape, device and strides kept."""
    dtype, op, inputs, view = data.draw(reduce_case(runner.world_size))
    expected = fold_tensors(op, inputs)
    for rank, r in enumerate(runner.run(reduce_in_place, inputs, op, view)):
        assert r["same_object"] and r["same_memory"], (rank, op, dtype)
        assert (r["dtype"], r["shape"], r["device"]) == (dtype, tuple(expected.shape), "cpu")
        assert r["strides_kept"]
        assert equal_values(r["value"], expected), (rank, op, r["value"], expected)


@given(
    dtype=st.sampled_from(REDUCE_DTYPES),
    shape=shapes(max_dims=2, max_side=70),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_ranks_agree_bit_for_bit(
    runner: Runner, dtype: torch.dtype, shape: tuple[int, ...], seed: int, data: st.DataObject
) -> None:
    """Arbitrary bit patterns (NaN payloads, subnormals, -0.0, overflow): every rank ends with the same bytes."""
    op = data.draw(st.sampled_from(valid_ops(dtype)))
    results = runner.run(reduce_bits, dtype, shape, seed, op)
    assert all(r == results[0] for r in results), (op, dtype)


@given(dtype=st.sampled_from(REDUCE_DTYPES), op=st.sampled_from(OPS))
def test_an_op_the_dtype_cannot_do_raises_on_every_rank(runner: Runner, dtype: torch.dtype, op: str) -> None:
    results = runner.run(reduce_outcome, dtype, op)
    if op in valid_ops(dtype):
        expected = fold_tensors(op, [torch.ones(3, dtype=dtype)] * runner.world_size)
        assert all(r[0] == "ok" and equal_values(r[1], expected) for r in results), results  # type: ignore[arg-type]
    else:
        same_error_everywhere(results, "UnsupportedOpError")


@given(dtype=st.sampled_from(MOVE_DTYPES), op=st.sampled_from(OPS))
def test_any_dtype_reduces_or_is_refused_on_every_rank(runner: Runner, dtype: torch.dtype, op: str) -> None:
    """Beyond the contract's five dtypes: a backend either reduces correctly or refuses with the same
    typed error on every rank before communicating; it never loses the group."""
    results = runner.run(reduce_outcome, dtype, op)
    assert len({r[0] for r in results}) == 1, results
    if results[0][0] == "ok":
        expected = fold_tensors(op, [torch.ones(3, dtype=dtype)] * runner.world_size)
        assert all(equal_values(v, expected) for _, v in results), (results, expected)  # type: ignore[arg-type]
    else:
        assert len({r[1] for r in results}) == 1
        assert results[0][1] in ("UnsupportedOpError", "UnsupportedValueError"), results
    assert runner.run(reduce_outcome, torch.float32, "SUM")[0][0] == "ok"  # the group still works


def op_outcome(ctx: DistContext, op: Any) -> tuple[bool, tuple[str, object]]:
    """Whether this context's backend lists ``op`` (``VALID_OPS``), and what reducing with it did."""
    return op in type(ctx).VALID_OPS, reduce_outcome(ctx, torch.float32, op)


def test_unknown_op_names_raise_on_every_rank(runner: Runner) -> None:
    """An op the backend does not list raises on every rank; one it lists (ADASUM on
    Horovod) reduces. Lower case and made-up names are never valid."""
    for op in ("sum", "ADASUM", "", "BAND"):
        results = runner.run(op_outcome, op)
        if all(valid for valid, _ in results):
            assert op == "ADASUM" and all(r[0] == "ok" for _, r in results), (op, results)
        else:
            same_error_everywhere([r for _, r in results], "UnsupportedOpError")
