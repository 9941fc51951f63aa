"""Never hang, never lie: each failure scenario ends in bounded time with a typed error.

Real gloo processes on loopback. Every scenario asserts the error class and what its
message names, and the harness's hard timeout turns any hang into a failure.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import idist
from multiproc import run_ranks
from semantics_cases import fresh_context


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


def _never_calls(rank: int, done: str) -> tuple[str, str, float]:
    ctx = idist.initialize("gloo", timeout=60)
    ctx.barrier()
    if rank == 1:
        # busy elsewhere: never joins the barrier, until rank 0 has its outcome (an event, not a
        # sleep long enough for it; 30 s at most, so a rank 0 that hangs fails the test, not this)
        deadline = time.monotonic() + 30
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.05)
        return ("skipped", "", 0.0)
    try:
        with ctx.timeout(2):
            return _outcome(ctx.barrier)
    finally:
        Path(done).touch()


def test_rank_that_never_arrives_is_named_after_the_section_timeout(tmp_path: Path) -> None:
    results = run_ranks(_never_calls, 2, str(tmp_path / "rank0-done"), timeout=90)
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


def test_different_collectives_unchecked_raise_the_same_error_on_every_rank() -> None:
    (n0, m0, t0), (n1, m1, t1) = run_ranks(_different_collectives, 2, False, timeout=90)
    assert n0 == n1 == "CollectiveMismatchError" and m0 == m1, (m0, m1)
    assert "rank 0: a tensor all_reduce of 16 bytes" in m0 and "rank 1: an all_gather" in m0, m0
    assert t0 < 10 and t1 < 10


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


# ------------------------------------------------------------------ issue 33
# One launch of 2 real gloo ranks; each case runs in a context of its own
# (semantics_cases.fresh_context), so that cases that break their group can share it.
def _try(fn: Callable[[], object]) -> tuple[str, Any]:
    try:
        value = fn()
    except idist.IdistError as exc:
        return type(exc).__name__, str(exc)
    except Exception as exc:  # a raw error is a bug here: report it as such
        return "raw " + type(exc).__name__, str(exc)
    return "ok", value.tolist() if isinstance(value, torch.Tensor) else value


MIXED: list[tuple[str, Callable[[], torch.Tensor], object]] = [
    ("float32[2] and float", lambda: torch.tensor([1.0, 2.0]), 1.0),
    ("float32[1000] and float", lambda: torch.ones(1000), 0.5),
    ("float64[1] and int", lambda: torch.ones(1, dtype=torch.float64), 3),
    ("int64[2] and int", lambda: torch.ones(2, dtype=torch.int64), 3),
]


def _agreement_cases(rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def run(case: str, checked: bool, first: Callable[[Any], object], *, late: float = 0.0) -> None:
        ctx = fresh_context(rank, 2, case, checked=checked)
        try:
            if rank == 1 and late:
                time.sleep(late)  # rank 1 arrives this much later
            start = time.monotonic()
            out[case] = _try(lambda: first(ctx))
            out[case + " took"] = time.monotonic() - start
            out[case + " next"] = _try(lambda: ctx.all_gather(rank + 10))
        finally:
            ctx.close()

    # 1: all_gather_tensors_with_shapes with a bad group on one rank
    def shapes(group: list[int] | None, declared: list[tuple[int]]) -> Callable[[Any], object]:
        return lambda c: c.all_gather_tensors_with_shapes(torch.ones(2) * rank, declared, group=group)

    run("shapes bad group checked", True, shapes([0, 1] if rank == 0 else [0, 9], [(2,), (2,)]))
    run("shapes bad group", False, shapes([0, 1] if rank == 0 else [0, 9], [(2,), (2,)]))
    run("shapes bad group everywhere", False, shapes([0, 9], [(2,), (2,)]))
    run("shapes wrong on one rank", False, shapes(None, [(2,), (2 + rank,)]))
    # 2: a tensor on one rank, a Python number on the other
    mixed = lambda c: c.all_reduce(torch.tensor([1.0, 2.0], dtype=torch.float64) if rank == 0 else 1.0)
    run("tensor and number checked", True, mixed)
    run("tensor and number", False, mixed)
    # ... of every size (gloo aborted a process on most of them), either rank the odd one
    for case, tensor, number in MIXED:
        run(case, False, lambda c, t=tensor, v=number: c.all_reduce(t() if rank == 0 else v))
        run(case + ", swapped", False, lambda c, t=tensor, v=number: c.all_reduce(v if rank == 0 else t()))
    run("numbers with different ops", False, lambda c: c.all_reduce(1.0 + rank, "SUM" if rank == 0 else "MAX"))
    run("tensor and a number's all_gather", False,
        lambda c: c.all_reduce(torch.ones(3)) if rank == 0 else c.all_gather(2))  # fmt: skip
    # 5: the same bad input on every rank, rank 1 arriving 2 s late
    run("bad op late", False, lambda c: c.all_reduce(torch.ones(2), "FOO"), late=2.0)
    run("bad src late", False, lambda c: c.broadcast(1.0, src=7), late=1.0)
    run("bad group late", False, lambda c: c.all_reduce(1, group=[0, 9]), late=1.0)
    # ... while a bad input on one rank only still breaks the group at once, also for a late peer
    run("bad op on one rank, peer late", False, lambda c: c.all_reduce(torch.ones(2), "FOO" if rank == 0 else "SUM"),
        late=2.0)  # fmt: skip

    # 13: a checked barrier that times out is named as a barrier
    def slow_barrier(c: Any) -> object:
        if rank == 1:
            time.sleep(3)
            return "slept"
        with c.timeout(1):
            return c.barrier()

    run("checked barrier timeout", True, slow_barrier)
    return out


@pytest.fixture(scope="module")
def agreement() -> list[dict[str, Any]]:
    return run_ranks(_agreement_cases, 2, timeout=240)  # type: ignore[no-any-return]


def test_a_bad_group_on_one_rank_never_pairs_ragged_gathers_wrongly(agreement: list[dict[str, Any]]) -> None:
    r0, r1 = agreement
    case = "shapes bad group checked"  # checked: every rank raises the bad rank's error; the group is usable
    assert r0[case][0] == r1[case][0] == "CollectiveInputError", (r0[case], r1[case])
    assert "rank 1" in r0[case][1] and "0..1" in r0[case][1]
    assert r0[case + " next"] == r1[case + " next"] == ("ok", [10, 11])
    case = "shapes bad group"  # unchecked: the group breaks on every rank; no call returns a peer's data
    assert r1[case][0] == "CollectiveInputError" and r0[case][0] == "GroupBrokenError", (r0[case], r1[case])
    assert r0[case + " next"][0] == r1[case + " next"][0] == "GroupBrokenError"
    case = "shapes bad group everywhere"
    assert r0[case][0] == r1[case][0] == "CollectiveInputError"
    assert r0[case + " next"] == r1[case + " next"] == ("ok", [10, 11])
    case = "shapes wrong on one rank"  # a rank's own entry is checked inside the gather: agreed
    assert r0[case][0] == r1[case][0] == "CollectiveInputError", (r0[case], r1[case])
    assert "rank 1" in r0[case][1]
    assert r0[case + " next"] == r1[case + " next"] == ("ok", [10, 11])


def test_a_tensor_against_a_number_never_returns_a_peers_data_twice(agreement: list[dict[str, Any]]) -> None:
    r0, r1 = agreement
    case = "tensor and number checked"
    assert r0[case][0] == r1[case][0] == "CollectiveMismatchError", (r0[case], r1[case])
    assert r0[case + " next"] == r1[case + " next"] == ("ok", [10, 11])
    # unchecked, the tensor's all_reduce and the number's gather never pair: every rank raises
    # the same error within seconds, naming both calls, and every later call raises (gloo aborts nobody)
    cases = ["tensor and number", "tensor and a number's all_gather"]
    cases += [c for case, _, _ in MIXED for c in (case, case + ", swapped")]
    for case in cases:
        assert r0[case][0] == r1[case][0] == "CollectiveMismatchError", (case, r0[case], r1[case])
        assert r0[case][1] == r1[case][1], case
        assert "rank 0: a tensor all_reduce" in r0[case][1] or "swapped" in case, r0[case][1]
        assert r0[case + " took"] < 10 and r1[case + " took"] < 10, case
        assert r0[case + " next"][0] == r1[case + " next"][0] == "GroupBrokenError", (case, r0, r1)
    # numbers carry their op: different ops raise on every rank, and the group stays usable
    case = "numbers with different ops"
    assert r0[case] == r1[case], (r0[case], r1[case])
    assert r0[case][0] == "CollectiveMismatchError" and "rank 0 SUM, rank 1 MAX" in r0[case][1], r0[case]
    assert r0[case + " next"] == r1[case + " next"] == ("ok", [10, 11])


def test_the_same_bad_input_everywhere_agrees_however_late_a_rank_arrives(agreement: list[dict[str, Any]]) -> None:
    r0, r1 = agreement
    for case, cls in (("bad op late", "UnsupportedOpError"), ("bad src late", "CollectiveInputError"),
                      ("bad group late", "CollectiveInputError")):  # fmt: skip
        assert r0[case][0] == r1[case][0] == cls, (case, r0[case], r1[case])
        assert r0[case + " took"] > 0.8  # rank 0 waited for rank 1 (the old window was 0.3 s) ...
        assert r0[case + " next"] == r1[case + " next"] == ("ok", [10, 11]), case  # ... and the group is usable
    case = "bad op on one rank, peer late"
    assert r0[case][0] == "UnsupportedOpError" and r1[case][0] == "GroupBrokenError", (r0[case], r1[case])
    assert r1[case + " took"] < 1.0, r1[case + " took"]  # from when the late peer arrived
    assert r0[case + " next"][0] == r1[case + " next"][0] == "GroupBrokenError"


def test_a_checked_barrier_that_times_out_is_named_as_a_barrier(agreement: list[dict[str, Any]]) -> None:
    name, text = agreement[0]["checked barrier timeout"]
    assert name == "CollectiveTimeoutError", text
    assert text.startswith("barrier (checked mode's comparison) on group [0, 1] failed"), text
    assert "ranks [1] did not arrive" in text, text
