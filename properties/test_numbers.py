"""``all_reduce(int / float / bool)``: exact, same type back, overflow is an error.

NaN behaviour (documented in properties/README.md): SUM/PRODUCT/AVERAGE follow IEEE
arithmetic on the left fold in rank order, so any NaN input gives NaN; MIN and MAX
propagate NaN too (as ``torch.minimum``/``torch.maximum`` do), so the result does not
depend on which rank holds the NaN. Every rank gets the same bits.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from idist import DistContext
from idist.testing import Runner

from ._support import (
    INT64_MAX,
    INT64_MIN,
    OPS,
    any_float,
    float_bits,
    fold_numbers,
    int64s,
    outcome,
    same_error_everywhere,
    value_ops,
)


def reduce_value(ctx: DistContext, values: list[Any], op: Any) -> tuple[str, object]:
    return outcome(lambda: ctx.all_reduce(values[ctx.rank], op))


def _all_same_bits(results: list[tuple[str, object]]) -> None:
    first = results[0][1]
    for _, v in results:
        assert type(v) is type(first)
        if isinstance(v, float):
            assert float_bits(v) == float_bits(first)  # type: ignore[arg-type]
        else:
            assert v == first


@given(data=st.data(), op=st.sampled_from(value_ops(int)))
def test_ints_are_exact_in_int64(runner: Runner, data: st.DataObject, op: str) -> None:
    """Any int64 inputs: the exact result as an int, or ReduceOverflowError on every rank if it leaves int64."""
    values = data.draw(
        st.lists(st.integers(INT64_MIN, INT64_MAX), min_size=runner.world_size, max_size=runner.world_size)
    )
    results = runner.run(reduce_value, values, op)
    expected = fold_numbers(op, values)
    if INT64_MIN <= expected <= INT64_MAX:
        assert results == [("ok", expected)] * runner.world_size
        assert all(type(v) is int for _, v in results)
    else:
        same_error_everywhere(results, "ReduceOverflowError")


@given(data=st.data())
def test_int_inputs_outside_int64_raise_on_every_rank(runner: Runner, data: st.DataObject) -> None:
    n = runner.world_size
    big = data.draw(st.one_of(st.integers(min_value=INT64_MAX + 1), st.integers(max_value=INT64_MIN - 1)))
    where = data.draw(st.integers(0, n - 1))
    # the others may bring the sum back into int64: the input alone is already an error
    others = data.draw(st.lists(int64s(), min_size=n, max_size=n))
    values = [big if r == where else others[r] for r in range(n)]
    same_error_everywhere(runner.run(reduce_value, values, "SUM"), "ReduceOverflowError")


@given(data=st.data(), op=st.sampled_from(value_ops(float)))
def test_floats_are_the_exact_left_fold(runner: Runner, data: st.DataObject, op: str) -> None:
    """Any float64 (±inf, -0.0, subnormals, NaN): the rank-order left fold in float64, bit for bit."""
    values = data.draw(st.lists(any_float(), min_size=runner.world_size, max_size=runner.world_size))
    results = runner.run(reduce_value, values, op)
    assert all(r[0] == "ok" and type(r[1]) is float for r in results), results
    _all_same_bits(results)
    got: float = results[0][1]  # type: ignore[assignment]
    expected = fold_numbers(op, values)
    if math.isnan(expected):
        assert math.isnan(got), (op, values, got)
    elif op in ("MIN", "MAX"):
        assert got == expected, (op, values, got)  # -0.0 and 0.0 tie: either is the minimum
    else:
        assert float_bits(got) == float_bits(expected), (op, values, got, expected)


@given(data=st.data(), op=st.sampled_from(value_ops(bool)))
def test_bools_reduce_to_bool(runner: Runner, data: st.DataObject, op: str) -> None:
    values = data.draw(st.lists(st.booleans(), min_size=runner.world_size, max_size=runner.world_size))
    expected = {"AND": all(values), "MIN": all(values), "OR": any(values), "MAX": any(values)}[op]
    assert runner.run(reduce_value, values, op) == [("ok", expected)] * runner.world_size


@given(kind=st.sampled_from([int, float, bool]), op=st.sampled_from(OPS))
def test_ops_a_python_type_cannot_do_raise_on_every_rank(runner: Runner, kind: type, op: str) -> None:
    values = [kind(1)] * runner.world_size
    results = runner.run(reduce_value, values, op)
    if kind is int and op == "AVERAGE":  # an average is a float, also of ints
        assert results == [("ok", 1.0)] * runner.world_size and all(type(r[1]) is float for r in results), results
    elif op in value_ops(kind):
        assert all(r[0] == "ok" and type(r[1]) is kind for r in results), results
    else:
        same_error_everywhere(results, "UnsupportedOpError")


@given(data=st.data())
def test_mixed_or_unsupported_types_raise_on_every_rank(runner: Runner, data: st.DataObject) -> None:
    """A bool among numbers, or a type all_reduce cannot reduce: an error everywhere; an int among
    floats reduces as a float, the same on every rank."""
    n = runner.world_size
    odd = data.draw(st.sampled_from(["text", b"bytes", None, [1], 1.5, True]))
    where = data.draw(st.integers(0, n - 1))
    values: list[object] = [odd if r == where else 7 for r in range(n)]
    if n == 1 and type(odd) in (float, bool):
        return  # one rank, one type: nothing is mixed
    results = runner.run(reduce_value, values, "MAX")
    if type(odd) is float:
        assert results == [("ok", 7.0)] * n and all(type(v) is float for _, v in results), results
    else:
        same_error_everywhere(results, "UnsupportedValueError")


def _sums_in_a_row(ctx: DistContext, calls: list[tuple[str, list[Any]]]) -> list[tuple[str, object]]:
    return [reduce_value(ctx, values, op) for op, values in calls]


@given(data=st.data())
def test_sums_in_a_row_are_each_the_exact_fold(runner: Runner, data: st.DataObject) -> None:
    """SUM/AVERAGE calls of changing kinds on one group: each one the exact fold, or one error everywhere.

    Small ints and two-rank floats take a one-collective path (one element once the group
    expects their kind), everything else the gather, and a group remembers the kind its last
    sum had; none of that may show."""
    n = runner.world_size
    near_2_40 = st.one_of(st.sampled_from([2**40 - 1, 2**40, 1 - 2**40, -(2**40), 0, -1]), st.integers(-(2**41), 2**41))
    calls: list[tuple[str, list[Any]]] = []
    for _ in range(data.draw(st.integers(1, 6))):
        kind = data.draw(st.sampled_from(["int", "float", "mixed"] if n > 1 else ["int", "float"]))
        op = data.draw(st.sampled_from(["SUM", "AVERAGE"]))
        values: list[Any]
        if kind == "int":
            values = data.draw(st.lists(near_2_40, min_size=n, max_size=n))
        elif kind == "float":
            values = data.draw(st.lists(any_float(), min_size=n, max_size=n))
        else:
            where = data.draw(st.integers(0, n - 1))
            values = [1.5 if r == where else 2 for r in range(n)]
        calls.append((op, values))
    results = runner.run(_sums_in_a_row, calls)
    for i, (op, values) in enumerate(calls):
        got = [r[i] for r in results]
        kinds = {type(v) for v in values}
        if kinds == {int} and op == "AVERAGE":  # the exact sum, divided once
            assert got == [("ok", sum(values) / n)] * n and all(type(v) is float for _, v in got), (values, got)
        elif kinds == {int}:
            assert got == [("ok", sum(values))] * n, (op, values, got)
            assert all(type(v) is int for _, v in got)
        else:  # floats, or ints among floats: reduced as floats, NaN bits and all
            _all_same_bits(got)
            expected = fold_numbers(op, [float(v) for v in values])
            assert all(type(v) is float for _, v in got), got
            value: float = got[0][1]  # type: ignore[assignment]
            assert float_bits(value) == float_bits(expected), (op, values, value, expected)
