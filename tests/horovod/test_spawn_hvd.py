"""spawn/Parallel with backend="horovod": 2 real Horovod ranks started by horovod.run.

Each launch goes parent → launcher process → horovod.run → 2 rank processes; the tests
check results, rank failures (raise, SIGKILL, sys.exit, an unpicklable result), Ctrl-C and a
killed parent, and that nothing outlives a launch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cases_spawn
import pytest

import idist
from idist import LaunchError
from launch_util import default_sigint, marker_pids, wait_gone, wait_markers

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("private_tmp")]

HERE = Path(__file__).resolve().parent


def _check(results: list[dict[str, object]], x: float, scale: int) -> None:
    assert [r["rank"] for r in results] == [0, 1]
    for rank, r in enumerate(results):
        assert r["type"] == "HorovodContext" and r["backend"] == "horovod" and r["world_size"] == 2
        assert r["local_rank_arg"] == r["local_rank"] == rank and r["horovod_rank"] == str(rank)
        assert r["sum"] == (x + 2 * x) * scale
        assert r["gathered"] == ["r0", "r1"]
        assert r["detected"] == "horovod" and r["launched_by"] == "horovodrun"
        assert r["leaked"] == {"RANK": None, "WORLD_SIZE": None, "MASTER_PORT": None}


def test_parallel_runs_fn_on_two_horovod_ranks() -> None:
    env_before = dict(os.environ)
    handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    with idist.Parallel(backend="horovod", nproc_per_node=2) as parallel:
        assert parallel.spawns
        results = parallel.run(cases_spawn.report, 1.5, scale=2)
        assert isinstance(idist.current(), idist.SerialContext)  # the parent stays uninitialized
    _check(results, 1.5, 2)
    # horovod.run's side effects (signal handlers, its rendezvous server) stayed in the launcher process
    assert dict(os.environ) == env_before
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers


def test_ignite_spawn_form_with_kwargs_dict() -> None:
    results = idist.spawn("horovod", cases_spawn.report, (0.25,), {"scale": 4}, nproc_per_node=2)
    _check(results, 0.25, 4)


@pytest.mark.parametrize("bad_rank", [0, 1])
def test_a_rank_that_raises_is_named_with_its_traceback(tmp_path: Path, bad_rank: int) -> None:
    marker = tmp_path / "pid"
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        idist.spawn("horovod", cases_spawn.fail_on, (bad_rank, str(marker), "raise"), nproc_per_node=2)
    took = time.monotonic() - start
    err = info.value
    # the rank that raised first, not the peer Horovod saw exit first (it lost its partner)
    assert (err.rank, err.local_rank, err.exitcode) == (bad_rank, bad_rank, 1)
    assert err.traceback is not None and f"deliberate failure on rank {bad_rank}" in err.traceback
    assert "ZeroDivisionError" in str(err) and f"the other ranks ({1 - bad_rank}) were stopped" in str(err)
    assert "PeerLostError" not in str(err)
    assert took < 90, took
    assert wait_gone(marker_pids(marker, 2), 10) == []


def test_a_rank_killed_by_a_signal_is_named_with_the_signal(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    with pytest.raises(LaunchError) as info:
        idist.spawn("horovod", cases_spawn.fail_on, (1, str(marker), "sigkill"), nproc_per_node=2)
    err = info.value
    assert err.rank == 1 and err.signal_name == "SIGKILL", str(err)
    assert "killed by SIGKILL" in str(err)
    assert wait_gone(marker_pids(marker, 2), 10) == []


def test_sys_exit_and_an_unpicklable_result_are_failures_of_that_rank(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as info:
        idist.spawn("horovod", cases_spawn.fail_on, (0, str(tmp_path / "a"), "exit"), nproc_per_node=2)
    assert info.value.rank == 0 and info.value.exitcode == 3 and "SystemExit: 3" in str(info.value)
    with pytest.raises(LaunchError, match="cannot be sent to the parent") as info:
        idist.spawn("horovod", cases_spawn.fail_on, (1, str(tmp_path / "b"), "unpicklable"), nproc_per_node=2)
    assert info.value.rank == 1


def _parent(marker: Path, tmp: Path) -> subprocess.Popen[str]:
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", TMPDIR=str(tmp))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, str(HERE / "cases_spawn.py"), str(marker), "2"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint,
    )  # fmt: skip


def test_ctrl_c_in_the_parent_stops_every_rank(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    parent = _parent(marker, tmp_path / "tmp")
    try:
        pids = wait_markers(marker, 2, timeout=180)
        parent.send_signal(signal.SIGINT)
        _, err = parent.communicate(timeout=60)
        assert parent.returncode in (1, 130, -signal.SIGINT), err[-3000:]
        assert "KeyboardInterrupt" in err
        assert wait_gone(pids, 15) == []
        assert list((tmp_path / "tmp").iterdir()) == []  # the report folder went with the launch
    finally:
        parent.kill()
        parent.communicate()


def test_a_parent_killed_with_sigkill_leaves_no_rank_behind(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    parent = _parent(marker, tmp_path / "killed")  # a parent killed outright cannot clean up its folder
    try:
        pids = wait_markers(marker, 2, timeout=180)
        parent.kill()
        parent.communicate(timeout=30)
        # the launcher process sees its parent gone (0.5 s watchdog) and Horovod's
        # middlemen see the launcher gone; each stops what it started
        assert wait_gone(pids, 30) == []
    finally:
        parent.kill()
        parent.communicate()
