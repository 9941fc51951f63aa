"""Liveness is not the collective timeout: a peer that stops answering is lost within the liveness
limit whatever the process group's timeout, and a peer that computes for a long time is not.

Real gloo processes on loopback with a process group timeout of 10 minutes. A process stopped
with SIGSTOP keeps its connections open and answers nothing, like a node behind a pulled cable
(the partitions themselves are in tests/netns/test_netns_liveness.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import idist
from idist._backends.native._liveness import interval_for
from idist._liveness_limit import DEFAULT_LIMIT, LIVENESS_VAR, limit_from
from launch_util import run_py
from multiproc import run_ranks

pytestmark = pytest.mark.timeout(240)

LIMIT = 3.0
PG_TIMEOUT = 600  # the collective timeout: never what ends these tests


def _threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("idist-liveness"))


def _slow_but_alive(rank: int) -> dict[str, Any]:
    ctx = idist.initialize("gloo", timeout=PG_TIMEOUT, liveness=LIMIT)
    out: dict[str, Any] = {"watching": _threads()}
    ctx.barrier()
    start = time.monotonic()
    if rank == 1:  # computes for three times the limit: Python code (the watcher shares the GIL) and a sleep
        end = start + 1.5 * LIMIT
        n = 0
        while time.monotonic() < end:
            n += 1
        time.sleep(1.5 * LIMIT)
    t = torch.full((4,), float(rank + 1))
    out["sum"] = ctx.all_reduce(t).tolist()
    out["waited"] = time.monotonic() - start
    out["later"] = ctx.all_reduce(rank + 1)
    idist.finalize()
    time.sleep(0.2)
    out["after_finalize"] = _threads()
    return out


def test_a_slow_rank_that_is_alive_is_never_declared_lost() -> None:
    r0, r1 = run_ranks(_slow_but_alive, 2, timeout=180)
    assert r0["waited"] >= 3 * LIMIT - 0.5, r0  # rank 0 really waited past the limit, in the collective
    for r in (r0, r1):
        assert r["sum"] == [3.0] * 4 and r["later"] == 3, r
        # the watcher (never the store) and the store thread; both gone once the context closed
        assert r["watching"] == ["idist-liveness", "idist-liveness-store"] and r["after_finalize"] == [], r


def _frozen_peer(rank: int, env_limit: bool) -> tuple[str, str, float]:
    ctx = idist.initialize("gloo", timeout=PG_TIMEOUT, **({} if env_limit else {"liveness": LIMIT}))
    pids = ctx.all_gather(os.getpid())
    ctx.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # alive, connections open, answering nothing
        return "resumed", "", 0.0
    start = time.monotonic()
    try:
        ctx.all_reduce(torch.ones(10))
        outcome = ("ok", "", 0.0)
    except idist.IdistError as exc:
        outcome = (type(exc).__name__, str(exc), time.monotonic() - start)
    os.kill(pids[1], signal.SIGKILL)
    try:
        ctx.all_reduce(1)
    except idist.GroupBrokenError:
        pass
    else:
        outcome = ("not broken", *outcome[1:])
    return outcome


@pytest.mark.parametrize("env_limit", [False, True], ids=["option", "variable"])
def test_a_frozen_peer_is_lost_within_the_limit_not_the_collective_timeout(env_limit: bool) -> None:
    env = {LIVENESS_VAR: str(LIMIT)} if env_limit else {LIVENESS_VAR: "900"}  # the option wins over the variable
    r0, r1 = run_ranks(_frozen_peer, 2, env_limit, timeout=120, env=env, may_die=frozenset({1}))
    name, msg, took = r0
    assert r1 == ("died", -signal.SIGKILL)
    assert name == "PeerLostError", msg
    assert "ranks [1] did not arrive" in msg and "no heartbeat" in msg and f"limit {LIMIT:g}s" in msg, msg
    bound = LIMIT + 2 * interval_for(LIMIT) + 3.0  # the limit, a round, a slice, a loaded machine
    assert LIMIT <= took < bound, (took, msg)


def _no_liveness(rank: int) -> list[str]:
    ctx = idist.initialize("gloo", timeout=PG_TIMEOUT)
    names = _threads()
    ctx.barrier()
    idist.finalize()
    return names


def test_liveness_zero_turns_it_off() -> None:
    assert run_ranks(_no_liveness, 2, env={LIVENESS_VAR: "0"}) == [[], []]


def test_the_limit_comes_from_the_option_then_the_variable_then_30_seconds() -> None:
    assert limit_from(None, {}) == DEFAULT_LIMIT == 30.0
    assert limit_from(None, {LIVENESS_VAR: "12.5"}) == 12.5
    assert limit_from(4, {LIVENESS_VAR: "12.5"}) == 4.0
    assert limit_from(0, {}) == 0.0
    with pytest.raises(idist.LaunchEnvironmentError, match="IDIST_LIVENESS='soon' is not a number"):
        limit_from(None, {LIVENESS_VAR: "soon"})
    for bad in (-1.0, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="liveness must be a number of seconds >= 0"):
            limit_from(bad, {})
    assert interval_for(30.0) == 1.0 and interval_for(3.0) == 0.3 and interval_for(0.1) == 0.05


def test_a_bad_liveness_option_is_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="liveness"):
        idist.initialize("gloo", liveness=-5)
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_rank_blocked_in_torchs_own_collective_ends_when_a_peer_is_lost(strategy: str) -> None:
    script = Path(__file__).parent / "launch_scripts" / "stuck_in_torch.py"
    start = time.monotonic()
    proc = run_py(["-m", "idist", "run", "-n", "2", str(script), strategy, str(LIMIT)], timeout=120)
    took = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "RANK 0 waits in" in out and "RANK 0 returned" not in out, out
    assert "idist.PeerLostError: ranks [1] stopped answering" in out, out
    assert "waits in torch's own collective above" in out and "exiting with status 1" in out, out
    assert took < 60, took  # the limit (3 s) and a few seconds, not the 10-minute group timeout
