"""groups: ``group=`` a list of global ranks or a ``new_group``; non-members get their input back."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

from idist import DistContext
from idist.testing import Runner

from ._support import fold_numbers, outcome, same_error_everywhere


def in_group(ctx: DistContext, ranks: list[int], use_new_group: bool, src: int, values: list[int]) -> dict[str, Any]:
    group: Any = ctx.new_group(ranks) if use_new_group else ranks
    mine = values[ctx.rank]
    t = torch.tensor([mine], dtype=torch.int64)
    out_t = ctx.all_reduce(t, "SUM", group=group)
    return {
        "sum": ctx.all_reduce(mine, "SUM", group=group),
        "max": ctx.all_reduce(float(mine), "MAX", group=group),
        "tensor": out_t.tolist(),
        "tensor_identity": out_t is t,
        "gather": ctx.all_gather(mine, group=group),
        "gather_t": [x.tolist() for x in ctx.all_gather(torch.arange(mine % 3), group=group)],
        "bcast": ctx.broadcast(mine, src=src, group=group),
        "after": ctx.all_reduce(1),  # the world still works after the subgroup calls
    }


def bad_group(ctx: DistContext, ranks: Any) -> tuple[str, object]:
    return outcome(lambda: ctx.all_reduce(1, group=ranks))


def bad_src_in_group(ctx: DistContext, ranks: list[int], src: int) -> tuple[str, object]:
    return outcome(lambda: ctx.broadcast(ctx.rank, src=src, group=ranks))


@given(data=st.data(), use_new_group=st.booleans())
def test_random_subsets_behave_as_their_own_world(runner: Runner, data: st.DataObject, use_new_group: bool) -> None:
    """Members reduce, gather (in member rank order) and broadcast among themselves only;
    every other rank gets its own input back, unchanged."""
    n = runner.world_size
    members = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    group = sorted(set(members))
    src = data.draw(st.sampled_from(group))
    values = data.draw(st.lists(st.integers(-1000, 1000), min_size=n, max_size=n))
    in_vals = [values[r] for r in group]
    for rank, r in enumerate(runner.run(in_group, members, use_new_group, src, values)):
        mine = values[rank]
        assert r["tensor_identity"] and r["after"] == n
        if rank in group:
            assert r["sum"] == fold_numbers("SUM", in_vals) and r["tensor"] == [sum(in_vals)]
            assert r["max"] == float(max(in_vals))
            assert r["gather"] == in_vals
            assert r["gather_t"] == [list(range(v % 3)) for v in in_vals]
            assert r["bcast"] == values[src]
        else:
            assert (r["sum"], r["max"], r["tensor"], r["gather"], r["bcast"]) == (
                mine, float(mine), [mine], [mine], mine
            )  # fmt: skip
            assert r["gather_t"] == [list(range(mine % 3))]


@given(data=st.data())
def test_bad_group_ranks_raise_on_every_rank(runner: Runner, data: st.DataObject) -> None:
    n = runner.world_size
    bad = data.draw(
        st.one_of(
            st.just([]),
            st.lists(st.integers(0, n - 1), max_size=3).flatmap(
                lambda ok: st.one_of(st.integers(max_value=-1), st.integers(min_value=n)).map(lambda b: [*ok, b])
            ),
            st.sampled_from(["0,1", 3.5, ["a"], [None], {"x": 1}]),
        )
    )
    same_error_everywhere(runner.run(bad_group, bad), "CollectiveInputError")


@given(data=st.data())
def test_broadcast_src_outside_the_group_raises_on_every_rank(runner: Runner, data: st.DataObject) -> None:
    n = runner.world_size
    if n < 2:
        return
    group = sorted(set(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n - 1))))
    src = data.draw(st.sampled_from([r for r in range(n) if r not in group]))
    results = runner.run(bad_src_in_group, group, src)
    # members are told the src is not in their group; non-members are outside the call
    for rank, r in enumerate(results):
        if rank in group:
            assert r == ("err", "CollectiveInputError"), (rank, r)
        else:
            assert r == ("ok", rank), (rank, r)
