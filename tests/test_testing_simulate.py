"""``idist.testing.simulate`` / ``SimulatedWorld``: the simulated-world contract, checked directly."""

from __future__ import annotations

import contextvars
import threading
import time
from typing import Any

import pytest
import torch

import idist
from idist import DistContext
from idist.testing import RankFailedError, SimulatedWorld, WorldTimeoutError, simulate

OUTER: contextvars.ContextVar[str] = contextvars.ContextVar("outer", default="unset")


def _rank_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("idist-sim-")]


@pytest.fixture(autouse=True)
def _no_threads_left() -> Any:
    yield
    deadline = time.monotonic() + 10
    while _rank_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _rank_threads(), "simulate left rank threads behind"


def test_results_in_rank_order_and_each_rank_current() -> None:
    def probe(ctx: DistContext, base: int) -> tuple[int, int, bool, int, float, list[int]]:
        return (
            idist.get_rank(),
            idist.get_world_size(),
            idist.current() is ctx,
            ctx.all_reduce(base + ctx.rank),
            idist.all_reduce(0.5),
            idist.all_gather(ctx.rank * 10),
        )

    got = simulate(4, probe, 100)
    assert got == [(r, 4, True, 406, 2.0, [0, 10, 20, 30]) for r in range(4)]


def test_each_rank_runs_in_a_fresh_contextvars_context() -> None:
    OUTER.set("caller")

    def probe(ctx: DistContext) -> tuple[str, str]:
        seen = OUTER.get()
        OUTER.set(f"rank{ctx.rank}")  # must not leak to other ranks or the caller
        ctx.barrier()
        return seen, OUTER.get()

    with idist.context("serial") as outer:
        assert simulate(3, probe) == [("unset", f"rank{r}") for r in range(3)]
        assert idist.current() is outer  # the caller's scoped context is untouched
    assert OUTER.get() == "caller"


def test_a_failing_rank_is_named_and_chained_promptly() -> None:
    def fail_on_one(ctx: DistContext) -> torch.Tensor:
        if ctx.rank == 1:
            raise KeyError("only on rank 1")
        return ctx.all_reduce(torch.ones(2))  # the others block here until rank 1 is gone

    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        simulate(3, fail_on_one, timeout=60)
    assert time.monotonic() - start < 30, "peers blocked on a failed rank must fail fast, not at the timeout"
    err = info.value
    assert err.rank == 1 and err.world_size == 3
    assert isinstance(err.__cause__, KeyError) and err.exception is err.__cause__
    assert next(iter(err.failures)) == 1
    assert "rank 1 of 3 failed: KeyError" in str(err)


def test_an_error_raised_on_every_rank_reports_the_first() -> None:
    def bad(ctx: DistContext) -> object:
        return ctx.broadcast(1, src=7)

    with pytest.raises(RankFailedError) as info:
        simulate(2, bad)
    assert isinstance(info.value.__cause__, idist.CollectiveInputError)
    assert sorted(info.value.failures) == [0, 1]


def test_a_timeout_names_the_ranks_that_did_not_finish() -> None:
    def stuck(ctx: DistContext) -> int:
        if ctx.rank == 2:
            time.sleep(2.5)  # never reaches the collective in time
            return -1
        return ctx.all_reduce(1)

    start = time.monotonic()
    with pytest.raises(WorldTimeoutError) as info:
        simulate(3, stuck, timeout=1.0)
    assert time.monotonic() - start < 1.8
    assert 2 in info.value.unfinished
    assert "did not finish within 1s" in str(info.value)


def test_a_world_is_reused_and_rebuilt_after_a_failure() -> None:
    def whoami(ctx: DistContext) -> tuple[int, int]:
        return ctx.rank, id(ctx)

    def boom(ctx: DistContext) -> None:
        raise ValueError(ctx.rank)

    with SimulatedWorld(2) as world:
        first = world.run(whoami)
        assert world.run(whoami) == first  # same contexts, same threads
        with pytest.raises(RankFailedError):
            world.run(boom)
        again = world.run(whoami)
        assert [r for r, _ in again] == [0, 1]
        assert world.run(lambda ctx: ctx.all_reduce(ctx.rank + 1)) == [3, 3]
    world.close()  # twice is fine


def test_threads_are_gone_after_success_and_failure() -> None:
    before = threading.active_count()
    simulate(3, lambda ctx: ctx.all_gather(ctx.rank))
    with pytest.raises(RankFailedError):
        simulate(3, lambda ctx: 1 / ctx.rank)
    assert threading.active_count() == before


@pytest.mark.parametrize("size", [0, -1, 1.5, True, "2"])
def test_bad_world_size_is_a_typed_error(size: Any) -> None:
    with pytest.raises(idist.LaunchEnvironmentError, match="world_size"):
        simulate(size, lambda ctx: None)


def test_bad_timeout_is_rejected() -> None:
    with pytest.raises(ValueError, match="timeout"):
        simulate(2, lambda ctx: None, timeout=0)


def test_a_world_of_one() -> None:
    t = torch.arange(3.0)
    assert simulate(1, lambda ctx, x: ctx.all_reduce(x.clone()).tolist(), t) == [[0.0, 1.0, 2.0]]
