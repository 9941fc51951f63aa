"""``idist.testing.ProcessWorld``, runner selection, and the pytest plugin."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import idist
from idist import DistContext
from idist.testing import (
    ProcessWorld,
    RankFailedError,
    RemoteError,
    Runner,
    SimulatedWorld,
    WorldTimeoutError,
    register_runner,
    runners_from_env,
)
from idist.testing._runners import DEFAULT_SPEC, parse_runners


# ------------------------------------------------------------- rank functions
def probe(ctx: DistContext, x: float) -> tuple[int, int, bool, float, int]:
    return ctx.rank, ctx.world_size, idist.current() is ctx, ctx.all_reduce(x), os.getpid()


def odd_tensors(ctx: DistContext) -> list[torch.Tensor]:
    return ctx.all_gather(torch.arange(ctx.rank + 1).to(torch.uint32))


def fail_on_one(ctx: DistContext) -> int:
    if ctx.rank == 1:
        raise KeyError("rank one")
    return ctx.rank


def block_on_one(ctx: DistContext) -> int:
    if ctx.rank == 1:
        raise KeyError("rank one")
    return ctx.all_reduce(1)  # rank 0 waits for rank 1, which never comes


class NeedsTwo(Exception):
    """Pickles, but cannot be rebuilt from its args (one of two)."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(f"code {code}: {why}")


def raise_needs_two(ctx: DistContext) -> None:
    raise NeedsTwo(7, f"the disk of rank {ctx.rank} is full")


def leader_fails(ctx: DistContext) -> None:
    with idist.one_rank_first():
        if ctx.rank == 0:
            raise ValueError("download failed")


def sleep_on_one(ctx: DistContext, seconds: float) -> int:
    if ctx.rank == 1:
        time.sleep(seconds)
    return ctx.rank


@pytest.fixture(scope="module")
def pool() -> Iterator[ProcessWorld]:
    with ProcessWorld(2, timeout=60) as world:
        yield world
    assert not multiprocessing.active_children(), "the pool left processes behind"


def test_runs_on_real_processes_in_rank_order(pool: ProcessWorld) -> None:
    got = pool.run(probe, 0.25)
    assert [g[:4] for g in got] == [(0, 2, True, 0.5), (1, 2, True, 0.5)]
    assert len({g[4] for g in got} | {os.getpid()}) == 3  # two processes, neither is this one
    assert pool.run(probe, 1.0)[0][4] == got[0][4]  # kept between runs


def test_any_dtype_travels_back(pool: ProcessWorld) -> None:
    got = pool.run(odd_tensors)
    for per_rank in got:
        assert [t.tolist() for t in per_rank] == [[0], [0, 1]]
        assert all(t.dtype == torch.uint32 for t in per_rank)


def test_a_failing_rank_is_named_and_the_pool_survives(pool: ProcessWorld) -> None:
    pids = {g[4] for g in pool.run(probe, 0.0)}
    with pytest.raises(RankFailedError) as info:
        pool.run(fail_on_one)
    assert info.value.rank == 1 and isinstance(info.value.__cause__, KeyError)
    assert "traceback on rank 1" in "".join(getattr(info.value.__cause__, "__notes__", []))
    assert {g[4] for g in pool.run(probe, 0.0)} == pids  # every rank finished: no restart


def test_an_exception_that_cannot_be_unpickled_keeps_its_message(pool: ProcessWorld) -> None:
    with pytest.raises(RankFailedError) as info:
        pool.run(raise_needs_two)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteError)
    # both ranks raise; the one reported first is blamed, and its own message is kept
    assert f"NeedsTwo: code 7: the disk of rank {info.value.rank} is full" in str(cause)
    assert "raise_needs_two" in str(cause)
    for _ in range(3):  # blame: the leader's own error, never a follower's LeaderFailedError
        with pytest.raises(RankFailedError) as info:
            pool.run(leader_fails)
        assert info.value.rank == 0 and isinstance(info.value.__cause__, ValueError)


def test_a_rank_stuck_after_a_failure_restarts_the_pool(pool: ProcessWorld) -> None:
    pids = {g[4] for g in pool.run(probe, 0.0)}
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        pool.run(block_on_one)
    assert time.monotonic() - start < 1.5  # the failed rank broke its group: rank 0 did not wait 3 s
    assert info.value.rank == 1
    assert "rank 1, which raised KeyError" in str(info.value.failures[0]), info.value.failures
    after = pool.run(probe, 0.5)
    assert [g[3] for g in after] == [1.0, 1.0] and {g[4] for g in after}.isdisjoint(pids)


def test_a_timeout_names_the_rank_and_stops_the_processes() -> None:
    with ProcessWorld(2, timeout=60) as world:
        # a first run, unbounded: unpickling the function imports this test module (and pytest) in
        # the ranks, seconds on a loaded machine, which the 2 s bound below is not about
        world.run(sleep_on_one, 0.0)
        world.timeout = 2
        procs = list(world._procs)
        with pytest.raises(WorldTimeoutError) as info:
            world.run(sleep_on_one, 30.0)
    assert info.value.unfinished == (1,)
    assert not any(p.is_alive() for p in procs)


# ------------------------------------------------------------ runner selection
def test_default_runners() -> None:
    specs = runners_from_env({})
    assert [s.label for s in specs] == DEFAULT_SPEC.split(",")
    assert isinstance(SimulatedWorld(2), Runner) and isinstance(ProcessWorld(2), Runner)


def test_runner_specs_parse() -> None:
    specs = parse_runners(" threads@3 , processes ,test_testing_pool:make_runner@5")
    assert [(s.name, s.world_size) for s in specs] == [
        ("threads", 3), ("processes", 2), ("test_testing_pool:make_runner", 5)
    ]  # fmt: skip
    built = specs[2].build()
    assert isinstance(built, SimulatedWorld) and built.world_size == 5


def make_runner(world_size: int) -> Runner:
    return SimulatedWorld(world_size, timeout=5)


@pytest.mark.parametrize("bad", ["", "nope@2", "threads@x", "threads@0", "os:path_that_is_missing"])
def test_bad_runner_specs(bad: str) -> None:
    with pytest.raises((ValueError, AttributeError)):
        parse_runners(bad)


def test_register_runner() -> None:
    register_runner("tiny", lambda n: SimulatedWorld(n, timeout=5))
    (spec,) = parse_runners("tiny@3")
    with spec.build() as world:  # type: ignore[attr-defined]
        assert world.run(lambda ctx: ctx.all_reduce(1)) == [3, 3, 3]
    with pytest.raises(ValueError, match="identifier"):
        register_runner("bad name", make_runner)


# ------------------------------------------------------------- pytest plugin
PLUGIN_TESTS = """
import pytest
import idist

def test_default_world(simulated_world):
    assert simulated_world.world_size == 2
    assert simulated_world.run(lambda ctx: idist.all_reduce(ctx.rank + 1)) == [3, 3]

@pytest.mark.simulated_world(4, timeout=20)
def test_marked(simulated_world):
    assert simulated_world.timeout == 20
    assert simulated_world.run(lambda ctx: idist.get_world_size()) == [4] * 4

@pytest.mark.simulated_world(world_size=3)
def test_marked_kw(simulated_world):
    assert simulated_world.run(lambda ctx: ctx.rank) == [0, 1, 2]

@pytest.mark.parametrize("simulated_world", [1, 3], indirect=True)
def test_indirect(simulated_world):
    n = simulated_world.world_size
    assert simulated_world.run(lambda ctx: len(idist.all_gather(0))) == [n] * n

def test_failure_is_reported(simulated_world):
    def boom(ctx):
        if ctx.rank == 1:
            raise ValueError("from rank 1")
    from idist.testing import RankFailedError
    with pytest.raises(RankFailedError, match="rank 1 of 2 failed: ValueError"):
        simulated_world.run(boom)

@pytest.mark.simulated_world(0)
def test_bad_size(simulated_world):
    pass
"""


def test_the_plugin_gives_users_a_simulated_world() -> None:
    with tempfile.TemporaryDirectory(prefix="idist-plugin-") as tmp:
        Path(tmp, "test_user.py").write_text(textwrap.dedent(PLUGIN_TESTS))
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
            cwd=tmp, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert "6 passed, 1 error" in out, out
    assert "world_size must be an int >= 1" in out, out


def test_plugin_is_registered() -> None:
    from importlib.metadata import entry_points

    names: Any = {e.value for e in entry_points(group="pytest11")}
    assert "idist.testing.pytest_plugin" in names
