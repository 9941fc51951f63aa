"""serial: every collective is the identity, and a ``SerialContext`` behaves exactly like
``simulate(1, ...)`` (a real one-rank gloo world) for every call and value."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import idist
from idist import DistContext
from idist.testing import SimulatedWorld, simulate

from ._support import OPS, REDUCE_DTYPES, any_float, encodable, plain_values, random_bits, same_value, shapes

Call = tuple[str, Any, Any]  # (collective, value, op or src)


def observe(ctx: DistContext, calls: list[Call]) -> list[tuple[str, Any, bool]]:
    """Run each call; report (status, result or error class, whether the input object came back)."""
    out: list[tuple[str, Any, bool]] = []
    for what, value, arg in calls:
        x = value.clone() if isinstance(value, torch.Tensor) else value
        try:
            if what == "all_reduce":
                got: Any = ctx.all_reduce(x, arg)
            elif what == "all_gather":
                got = ctx.all_gather(x)
            elif what == "broadcast":
                got = ctx.broadcast(x, src=arg)
            else:
                ctx.barrier()
                got = None
        except idist.IdistError as exc:
            out.append(("err", type(exc).__name__, False))
            continue
        # identity is the contract for tensors only (reduced / received in place)
        out.append(("ok", got, isinstance(x, torch.Tensor) and got is x))
    return out


@st.composite
def calls(draw: st.DrawFn) -> list[Call]:
    def one() -> st.SearchStrategy[Call]:
        tensor = st.builds(
            random_bits, st.sampled_from(REDUCE_DTYPES), shapes(), st.integers(0, 2**31)
        )  # fmt: skip
        number = st.one_of(st.integers(-(2**70), 2**70), any_float(), st.booleans(), st.text(max_size=3))
        return st.one_of(
            st.tuples(st.just("all_reduce"), st.one_of(tensor, number), st.sampled_from([*OPS, "bogus"])),
            st.tuples(st.just("all_gather"), st.one_of(tensor, plain_values()), st.none()),
            st.tuples(st.just("broadcast"), st.one_of(tensor, plain_values()), st.sampled_from([0, 0, 1, -1])),
            st.tuples(st.just("barrier"), st.none(), st.none()),
        )

    return draw(st.lists(one(), min_size=1, max_size=4))


@pytest.fixture(scope="module")
def one_rank() -> Iterator[SimulatedWorld]:
    with SimulatedWorld(1) as world:
        yield world


@given(todo=calls())
def test_serial_is_simulate_of_one(one_rank: SimulatedWorld, todo: list[Call]) -> None:
    todo = [c for c in todo if encodable(c[1])]
    with idist.context("serial") as serial:
        expected = observe(serial, todo)
    (got,) = one_rank.run(observe, todo)
    assert len(got) == len(expected)
    for call, e, g in zip(todo, expected, got, strict=True):
        assert e[0] == g[0] and e[2] == g[2], (call, e, g)
        if e[0] == "err":
            assert e[1] == g[1], (call, e, g)
        else:
            assert same_value(e[1], g[1]), (call, e, g)


@given(todo=calls())
def test_serial_collectives_are_the_identity(todo: list[Call]) -> None:
    todo = [c for c in todo if encodable(c[1])]
    with idist.context("serial") as serial:
        for (what, value, op), (status, got, identity) in zip(todo, observe(serial, todo), strict=True):
            if status == "err" or what == "barrier":
                continue
            if what == "all_reduce" and op == "AVERAGE" and type(value) is int:
                value = float(value)  # AVERAGE of ints is a float, as on any world (docs/semantics.md)
            assert identity == (isinstance(value, torch.Tensor) and what != "all_gather"), (what, value, got)
            if what == "all_gather":
                assert same_value(got, [value])
            else:
                assert same_value(got, value)


def test_simulate_of_one_is_a_one_rank_world() -> None:
    def probe(ctx: DistContext, x: float) -> tuple[int, int, Any, list[float]]:
        return ctx.rank, ctx.world_size, idist.current() is ctx, ctx.all_gather(ctx.all_reduce(x))

    assert simulate(1, probe, 0.1) == [(0, 1, True, [0.1])]
