"""Never hang, never lie: each failure scenario ends in bounded time with a typed error.

Real gloo processes on loopback. Every scenario asserts the error class and what its
message names, and the harness's hard timeout turns any hang into a failure.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch

import idist
from multiproc import run_ranks


def _outcome(fn: Any) -> tuple[str, str, float]:
    start = time.monotonic()
    try:
        fn()
    except BaseException as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "ok", "", time.monotonic() - start


def _killed_mid_collective(rank: int) -> tuple[str, str, float]:
    ctx = idist.initialize("gloo", timeout=60)
    ctx.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return _outcome(lambda: ctx.all_reduce(torch.ones(1000)))


def test_rank_killed_mid_collective_gives_peer_lost_on_survivors() -> None:
    results = run_ranks(_killed_mid_collective, 2, may_die=frozenset({1}), timeout=90)
    assert results[1] == ("died", -signal.SIGKILL)
    name, msg, took = results[0]
    assert name == "PeerLostError", msg
    assert "ranks [1] did not arrive" in msg and "finalize and restart" in msg
    assert took < 15


def _never_calls(rank: int) -> tuple[str, str, float]:
    ctx = idist.initialize("gloo", timeout=60)
    ctx.barrier()
    if rank == 1:
        time.sleep(8)  # busy elsewhere: never joins the barrier in time
        return ("skipped", "", 0.0)
    with ctx.timeout(2):
        return _outcome(ctx.barrier)


def test_rank_that_never_arrives_is_named_after_the_section_timeout() -> None:
    results = run_ranks(_never_calls, 2, timeout=90)
    name, msg, took = results[0]
    assert name == "CollectiveTimeoutError", msg
    assert "ranks [1] did not arrive" in msg
    assert 1.5 < took < 10


def _different_collectives(rank: int, checked: bool) -> tuple[str, str, float]:
    ctx = idist.initialize("gloo", timeout=20, checked=checked)
    try:
        if rank == 0:
            return _outcome(lambda: ctx.all_reduce(torch.ones(4)))
        return _outcome(lambda: ctx.all_gather(torch.ones(4)))
    finally:
        idist.finalize()


def test_different_collectives_checked_raise_a_table_on_every_rank() -> None:
    results = run_ranks(_different_collectives, 2, True, timeout=90)
    for name, msg, took in results:
        assert name == "CollectiveMismatchError", msg
        assert "all_reduce" in msg and "all_gather" in msg and "test_failures.py" in msg
        assert took < 10


def _ragged(rank: int, checked: bool) -> tuple[str, str, float]:
    ctx = idist.initialize("gloo", timeout=20, checked=checked)
    with ctx.timeout(10):
        return _outcome(lambda: ctx.all_reduce(torch.ones(1000 if rank == 0 else 10)))


def test_ragged_all_reduce_checked_is_a_typed_error_on_every_rank() -> None:
    results = run_ranks(_ragged, 2, True, timeout=90)
    for name, msg, _ in results:
        assert name == "CollectiveMismatchError", msg
        assert "(1000,)" in msg and "(10,)" in msg


def test_ragged_all_reduce_unchecked_ends_in_bounded_time() -> None:
    # gloo aborts the rank that receives more than it expected (SIGABRT, uncatchable);
    # the survivor gets a typed error instead of garbage or a hang.
    results = run_ranks(_ragged, 2, False, timeout=90, may_die=frozenset({0, 1}))
    died = [r for r in results if r[0] == "died"]
    alive = [r for r in results if r[0] != "died"]
    assert len(died) >= 1
    for name, msg, _ in alive:
        assert name in ("PeerLostError", "CollectiveTimeoutError"), msg


def _ragged_gather(rank: int, checked: bool) -> list[tuple[int, ...]]:
    ctx = idist.initialize("gloo", timeout=20, checked=checked)
    return [tuple(t.shape) for t in ctx.all_gather(torch.ones(5 + rank * 100, 2))]


def test_ragged_all_gather_is_fine_with_and_without_checking() -> None:
    for checked in (False, True):
        assert run_ranks(_ragged_gather, 2, checked) == [[(5, 2), (105, 2)]] * 2


def _leader_fails(rank: int) -> dict[str, tuple[str, str, float]]:
    ctx = idist.initialize("gloo", timeout=30)
    out: dict[str, tuple[str, str, float]] = {}
    ran: list[int] = []

    def first() -> None:
        with ctx.one_rank_first():
            if rank == 0:
                raise OSError("download failed: no network")
            ran.append(rank)

    out["first"] = _outcome(first)

    @ctx.one_rank_only()
    def save() -> None:
        raise ValueError("disk full")

    out["only"] = _outcome(save)
    out["ran_block"] = ("ran" if ran else "did not run", "", 0.0)
    out["consensus"] = ("ok", str(ctx.any_rank_failed(rank == 1)), 0.0)
    out["still_usable"] = ("ok", str(ctx.all_reduce(1)), 0.0)
    return out


def test_leader_exception_in_one_rank_first_and_only() -> None:
    r0, r1 = run_ranks(_leader_fails, 2, timeout=90)
    assert r0["first"][:2] == ("OSError", "download failed: no network")
    assert r1["first"][0] == "LeaderFailedError"
    assert "rank 0 raised inside one_rank_first" in r1["first"][1] and "no network" in r1["first"][1]
    assert r1["ran_block"][0] == "did not run"
    assert r0["only"][:2] == ("ValueError", "disk full")
    assert r1["only"][0] == "LeaderFailedError" and "disk full" in r1["only"][1]
    assert r0["consensus"][1] == r1["consensus"][1] == "True"
    assert r0["still_usable"][1] == r1["still_usable"][1] == "2"


def _checked_happy_path(rank: int) -> list[Any]:
    os.environ["IDIST_CHECKED"] = "1"  # the environment switch
    ctx = idist.initialize("gloo", timeout=20)
    out: list[Any] = [ctx.checked]
    for _ in range(5):
        out.append(ctx.all_reduce(rank + 1))
    out.append(ctx.all_gather(torch.ones(rank + 1)).__len__())
    out.append(ctx.broadcast("x" if rank == 0 else None))
    ctx.barrier()
    return out


def test_checked_mode_from_environment_runs_correct_code_unchanged() -> None:
    assert run_ranks(_checked_happy_path, 2) == [[True, 3, 3, 3, 3, 3, 2, "x"]] * 2
