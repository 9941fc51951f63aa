"""``all_gather``: one entry per rank in rank order, exact round trips, any shapes."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

from idist import DistContext
from idist.testing import Runner

from ._support import (
    MOVE_DTYPES,
    encodable,
    outcome,
    plain_values,
    random_bits,
    same_error_everywhere,
    same_tensor,
    same_value,
    shapes,
)


def gather_rounds(ctx: DistContext, rounds: list[list[Any]]) -> list[tuple[str, object]]:
    """Gather this rank's value of every round, one round after the other (the slot adapts)."""
    return [outcome(lambda v=values[ctx.rank]: ctx.all_gather(v)) for values in rounds]  # type: ignore[misc]


def gather_tensor(
    ctx: DistContext, dtypes: list[torch.dtype], shapes_: list[tuple[int, ...]], seed: int, view: bool
) -> tuple[str, object]:
    t = random_bits(dtypes[ctx.rank], shapes_[ctx.rank], seed + ctx.rank)
    if view and t.dim() >= 2:
        t = t.transpose(0, 1)  # a strided input gathers its logical value
    return outcome(lambda: [x.clone() for x in ctx.all_gather(t)])


def gather_mixed(ctx: DistContext, tensor_ranks: list[int]) -> tuple[str, object]:
    return outcome(lambda: ctx.all_gather(torch.ones(2) if ctx.rank in tensor_ranks else 1.0))


def gather_unpicklable(ctx: DistContext, where: int) -> tuple[str, object]:
    value: object = (lambda: None) if ctx.rank == where else ctx.rank
    return outcome(lambda: ctx.all_gather(value))


@given(data=st.data())
def test_values_round_trip_exactly_in_rank_order(runner: Runner, data: st.DataObject) -> None:
    """int (any size), float (any bits), bool, str (any Unicode), bytes, Path, None and picklable
    containers: entry ``i`` is exactly rank ``i``'s value, same type; several rounds in a row."""
    n = runner.world_size
    rounds = data.draw(st.lists(st.lists(plain_values(), min_size=n, max_size=n), min_size=1, max_size=3))
    for rank, per_round in enumerate(runner.run(gather_rounds, rounds)):
        for values, (status, got) in zip(rounds, per_round, strict=True):
            if all(encodable(v) for v in values):
                assert status == "ok", (rank, got)
                assert same_value(got, values), (rank, got, values)
            else:
                # a value that cannot be encoded fails the call on every rank, not just its own
                assert (status, got) == ("err", "UnsupportedValueError"), (rank, got)


@given(text=st.text(st.characters(exclude_categories=()), min_size=1000, max_size=5000))
def test_long_unicode_crosses_the_slot(runner: Runner, text: str) -> None:
    """Long str and bytes (bigger than the agreed slot, UTF-8 multi-byte, surrogates) round-trip exactly."""
    n = runner.world_size
    values = [text[: len(text) * (r + 1) // n] for r in range(n)]
    blobs = [text.encode("utf-8", "surrogatepass")[r:] for r in range(n)]
    rounds: list[list[Any]] = [values, blobs, values[::-1]]
    results = runner.run(gather_rounds, rounds)
    for per_round in results:
        assert per_round[0] == ("ok", values)
        assert per_round[1] == ("ok", blobs)
        assert per_round[2] == ("ok", values[::-1])


@given(
    dtype=st.sampled_from(MOVE_DTYPES),
    data=st.data(),
    seed=st.integers(0, 2**31),
    view=st.booleans(),
)
def test_tensors_of_any_shape_round_trip_bit_for_bit(
    runner: Runner, dtype: torch.dtype, data: st.DataObject, seed: int, view: bool
) -> None:
    """Every dtype; shapes differ between ranks (empty ones too); entry ``i`` is rank ``i``'s tensor, bit for bit."""
    n = runner.world_size
    per_rank = data.draw(st.lists(shapes(max_side=6), min_size=n, max_size=n))
    results = runner.run(gather_tensor, [dtype] * n, per_rank, seed, view)
    expected = []
    for r in range(n):
        t = random_bits(dtype, per_rank[r], seed + r)
        expected.append(t.transpose(0, 1) if view and t.dim() >= 2 else t)
    for status, got in results:
        assert status == "ok", got
        assert isinstance(got, list) and len(got) == n
        assert all(same_tensor(g, e) for g, e in zip(got, expected, strict=True))


@given(data=st.data())
def test_mismatched_dtypes_raise_on_every_rank(runner: Runner, data: st.DataObject) -> None:
    n = runner.world_size
    dtypes = data.draw(st.lists(st.sampled_from(MOVE_DTYPES), min_size=n, max_size=n))
    two: list[tuple[int, ...]] = [(2,)] * n
    results = runner.run(gather_tensor, dtypes, two, 0, False)
    if len(set(dtypes)) == 1:
        assert all(s == "ok" for s, _ in results)
    else:
        same_error_everywhere(results, "CollectiveInputError")


@given(data=st.data())
def test_tensor_on_some_ranks_only_raises_on_every_rank(runner: Runner, data: st.DataObject) -> None:
    n = runner.world_size
    tensor_ranks = data.draw(st.lists(st.integers(0, n - 1), unique=True))
    results = runner.run(gather_mixed, tensor_ranks)
    if len(tensor_ranks) in (0, n):
        assert all(s == "ok" for s, _ in results)
    else:
        same_error_everywhere(results, "CollectiveInputError")


@given(data=st.data())
def test_an_unpicklable_value_raises_on_every_rank(runner: Runner, data: st.DataObject) -> None:
    where = data.draw(st.integers(0, runner.world_size - 1))
    same_error_everywhere(runner.run(gather_unpicklable, where), "UnsupportedValueError")
