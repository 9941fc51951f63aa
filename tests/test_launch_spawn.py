"""idist.spawn on real processes: both signatures, fail-fast, signals, handles, ports, nodes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import idist
import launch_fns
from idist.launch import LaunchConfigError, LaunchError, reserve_port
from launch_util import SCRIPTS, alive, clean_env, default_sigint, marker_pids, wait_gone, wait_markers

pytestmark = pytest.mark.timeout(300)


def test_torch_mp_form_sets_the_launcher_variables_and_initialize_just_works(monkeypatch: pytest.MonkeyPatch) -> None:
    # called by keyword (spawn picks the form by its first argument, positional or not: fn= here), and
    # from inside an mpirun job: the children's rank is spawn's, not OpenMPI's, and its variables stay out
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")
    out = idist.spawn(fn=launch_fns.report, args=("mp",), nprocs=2)
    assert [r["rank"] for r in out] == [0, 1]
    ports = {r["env"]["MASTER_PORT"] for r in out}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for local, r in enumerate(out):
        assert r["tag"] == "mp" and r["local_rank_arg"] == local and r["ompi_seen"] is None
        assert r["env"] == {
            "RANK": str(local), "LOCAL_RANK": str(local), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "0", "NNODES": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": r["env"]["MASTER_PORT"],
        }  # fmt: skip
        assert (r["type"], r["backend"], r["world_size"], r["local_rank"]) == ("NativeContext", "gloo", 2, local)
        assert (r["node_rank"], r["nnodes"], r["nproc_per_node"]) == (0, 1, 2)
        assert r["gathered"] == [0, 1] and r["sum"] == 3
    assert all(not alive(r["pid"]) for r in out)


def _board_fds() -> list[str]:
    """This process's descriptors on a stall-marks board."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if "idist-stall-marks" in os.readlink(f"/proc/self/fd/{fd}"):
                found.append(fd)
    return found


@pytest.mark.parametrize("start_method", ["spawn", "forkserver", "fork"])
def test_ranks_share_stall_marks_so_a_node_mate_in_flight_is_seen(start_method: str) -> None:
    """As under ``idist run``: a failing rank counts a node-mate whose mark shows it in the failed
    call as arrived, however late it is to say so (a loaded machine), instead of naming it missing.
    The launcher keeps no descriptor of the board once the ranks started."""
    out = idist.spawn("gloo", launch_fns.sees_mate_in_flight, (), nproc_per_node=2, start_method=start_method)
    assert out == [(True, False), (True, True)]
    assert _board_fds() == []


def test_ignite_form_initializes_around_fn_with_kwargs_dict() -> None:
    # every argument by keyword: backend= first picks ignite's form (its positional call is in test_launch_elastic_fn)
    out = idist.spawn(
        backend="gloo", fn=launch_fns.ignite_style, args=(1,), kwargs_dict={"b": 2, "c": 3}, nproc_per_node=2
    )
    assert out == [
        {"local_rank_arg": k, "rank": k, "world_size": 2, "backend": "gloo", "model": "native-dist", "value": 12}
        for k in range(2)
    ]


@pytest.mark.parametrize(
    ("how", "exitcode", "signal_name", "says"),
    [
        ("raise", 1, None, "ValueError: boom from rank 1"),
        ("exit3", 3, None, "sys.exit(3)"),
        ("sigkill", -signal.SIGKILL, "SIGKILL", "was killed by SIGKILL"),
        ("os_exit0", 0, None, "before fn returned"),
        ("unpicklable", 1, None, "cannot be sent to the parent"),
    ],
)
def test_a_failing_rank_fails_the_launch_fast_and_the_others_are_stopped(
    tmp_path: Path, how: str, exitcode: int, signal_name: str | None, says: str
) -> None:
    marker = tmp_path / "pid"
    n = 3 if how == "raise" else 2  # three ranks once: both neighbours of the failed rank are stopped
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        idist.spawn(launch_fns.fail_on, args=(1, how, str(marker)), nprocs=n)
    elapsed = time.monotonic() - start
    e = info.value
    assert (e.rank, e.local_rank, e.exitcode, e.signal_name) == (1, 1, exitcode, signal_name)
    assert says in str(e) and "rank 1 (local rank 1) failed" in str(e)
    assert ("the other ranks (0, 2) were stopped" if n == 3 else "the other ranks (0) were stopped") in str(e)
    if how == "raise":
        assert e.traceback is not None and "launch_fns.py" in e.traceback and 'raise ValueError(f"boom' in e.traceback
    pids = [int(Path(f"{marker}.{r}").read_text()) for r in range(n)]
    assert wait_gone(pids, timeout=1.0) == []
    # The healthy ranks sit in a barrier (and then sleep 600 s): only fail-fast ends this.
    assert elapsed < 120, elapsed


def test_a_rank_failing_just_after_the_first_reports_its_own_error_before_it_is_stopped(tmp_path: Path) -> None:
    """Ranks usually fail together (a peer lost, a store gone): the others get a moment to end on
    their own (their except/finally blocks run) before they are stopped; the first is blamed."""
    with pytest.raises(LaunchError) as info:
        idist.spawn(launch_fns.fail_then_peer_fails, args=(str(tmp_path),), nprocs=2)
    assert info.value.rank == 1 and "rank 1 failed first" in str(info.value)
    assert (tmp_path / "rank0-reported").exists(), "rank 0 was stopped before it could report"


def test_join_false_returns_a_handle_to_poll_join_or_terminate(tmp_path: Path) -> None:
    handle = idist.spawn(launch_fns.add, args=(10,), nprocs=2, join=False)
    assert isinstance(handle, idist.SpawnHandle)
    port = handle.master_port  # the port reserved for the launch
    assert port is not None
    deadline = time.monotonic() + 120
    while not handle.done():  # polls for real: no join() needed first
        assert time.monotonic() < deadline, handle
        time.sleep(0.05)
    assert handle.join(timeout=0) is True
    assert handle.results == [10, 11]
    with socket.socket() as s:  # the reserved port is free again once the launch ended: binds without SO_REUSEADDR
        s.bind(("127.0.0.1", port))
    marker = tmp_path / "pid"
    handle2 = idist.spawn(launch_fns.sleeper, (str(marker),), 2, False)
    pids = wait_markers(marker, 2)
    assert handle2.join(timeout=0) is False and handle2.join(timeout=0.2) is False and not handle2.done()
    with pytest.raises(LaunchError, match="still running"):
        _ = handle2.results
    handle2.terminate()
    assert wait_gone(pids, timeout=1.0) == [] and handle2.done()
    # stopped ranks are failures, never ranks that returned None
    for look in (handle2.join, lambda: handle2.results):
        with pytest.raises(LaunchError, match=r"rank 0 \(local rank 0\) failed: was stopped by terminate\(\) before fn "
                           r"returned \(killed by SIGTERM\)") as info:  # fmt: skip
            look()
        assert info.value.rank == 0 and info.value.signal_name == "SIGTERM"


def test_a_ranks_children_end_with_the_launch(tmp_path: Path) -> None:
    """A rank's background child is ended when the launch ends, whether the rank returned or raised."""
    marker = tmp_path / "ok"
    assert idist.spawn(launch_fns.with_child, args=(str(marker), -1), nprocs=2) == [0, 1]
    assert wait_gone(_children(marker), timeout=1.0) == []
    marker = tmp_path / "fail"
    with pytest.raises(LaunchError, match="rank 1 fails with a child running"):
        idist.spawn(launch_fns.with_child, args=(str(marker), 1), nprocs=2)
    assert wait_gone(_children(marker), timeout=1.0) == []


def _children(marker: Path, n: int = 2) -> list[int]:
    return [int(Path(f"{marker}.{r}.child").read_text()) for r in range(n)]


def test_handle_context_manager_stops_ranks_on_an_exception(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    with pytest.raises(KeyboardInterrupt):
        with idist.spawn(launch_fns.sleeper, args=(str(marker),), nprocs=2, join=False):
            pids = wait_markers(marker, 2)
            raise KeyboardInterrupt
    assert wait_gone(pids, timeout=1.0) == []


@contextlib.contextmanager
def _sleepers(marker: Path, how: str) -> Iterator[subprocess.Popen[str]]:
    """The parent of a ``spawn`` of 2 sleeping ranks; killed (if still there) when the test ends."""
    # SIGINT at its default, as in a terminal: started by a shell without job control (a background
    # job of a script), the test command and everything it starts would otherwise ignore SIGINT
    parent = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "spawn_sleepers.py"), str(marker), "2", how],
        env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint,
    )  # fmt: skip
    try:
        yield parent
    finally:
        parent.kill()
        parent.wait()


def test_ctrl_c_in_the_parent_stops_every_rank(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    with _sleepers(marker, "plain") as parent:
        pids = wait_markers(marker, 2)
        parent.send_signal(signal.SIGINT)
        _, err = parent.communicate(timeout=60)
        assert parent.returncode in (130, -signal.SIGINT), err
        assert "KeyboardInterrupt" in err
        assert wait_gone(pids, timeout=1.0) == []


def test_a_ctrl_c_as_a_rank_starts_stops_that_rank_too(tmp_path: Path) -> None:
    """A Ctrl-C the moment a rank's process has started, before spawn has noted it, must still stop
    it: multiprocessing's exit hook would otherwise wait for it (600 s here) after the parent gave up."""
    marker = tmp_path / "pid"
    with _sleepers(marker, "ctrl-c-at-start") as parent:
        _, err = parent.communicate(timeout=60)
        assert parent.returncode in (130, -signal.SIGINT) and "KeyboardInterrupt" in err, err[-3000:]
        started = marker_pids(tmp_path / "pid.started", 2)
        assert len(started) == 2 and wait_gone(started, timeout=1.0) == []


def test_a_second_ctrl_c_kills_ranks_that_carry_on_through_sigterm(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    with _sleepers(marker, "stubborn") as parent:
        pids = wait_markers(marker, 2)
        parent.send_signal(signal.SIGINT)
        time.sleep(0.3)  # inside the 3 s grace the first one started
        parent.send_signal(signal.SIGINT)
        assert wait_gone(pids, timeout=3.0) == []
        _, err = parent.communicate(timeout=30)
        assert parent.returncode in (130, -signal.SIGINT) and "KeyboardInterrupt" in err, err[-3000:]


def test_a_parent_killed_with_sigkill_leaves_no_orphans(tmp_path: Path) -> None:
    """The ranks die with their parent (the kernel's parent-death signal), and what they started with
    them (the sweeper the launch started ends the ranks' sessions)."""
    marker = tmp_path / "pid"
    with _sleepers(marker, "children") as parent:
        pids = wait_markers(marker, 2)
        children = _children(marker)
        parent.kill()
        parent.wait()
        start = time.monotonic()
        assert wait_gone(pids, timeout=5.0) == []
        assert time.monotonic() - start < 1.0  # the ranks end within a second
        assert wait_gone(children, timeout=5.0) == []


def test_two_launches_at_the_same_moment_both_pass() -> None:
    results: dict[str, Any] = {}

    def launch(tag: str) -> None:
        try:
            results[tag] = idist.spawn(launch_fns.report, args=(tag,), nprocs=2)
        except BaseException as e:
            results[tag] = e

    threads = [threading.Thread(target=launch, args=(t,)) for t in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    a, b = results["a"], results["b"]
    assert isinstance(a, list) and isinstance(b, list), results
    assert [r["sum"] for r in a + b] == [3] * 4
    assert a[0]["env"]["MASTER_PORT"] != b[0]["env"]["MASTER_PORT"]


def test_multi_node_on_one_host_forms_one_world_of_four() -> None:
    with reserve_port() as reservation:
        node0 = idist.spawn(
            launch_fns.report, args=("n0",), nprocs=2, join=False, nnodes=2, node_rank=0, master_port=reservation.port
        )
        try:
            node1 = idist.spawn(launch_fns.report, args=("n1",), nprocs=2, nnodes=2, node_rank=1,
                                master_port=reservation.port)  # fmt: skip
            node0.join(timeout=180)
        finally:
            node0.terminate()
    out = node0.results + node1
    assert [r["rank"] for r in out] == [0, 1, 2, 3]
    for r in out:
        assert (r["world_size"], r["nnodes"], r["nproc_per_node"]) == (4, 2, 2)
        assert r["node_rank"] == r["rank"] // 2 and r["local_rank"] == r["rank"] % 2
        assert r["env"]["GROUP_RANK"] == str(r["rank"] // 2) and r["env"]["NNODES"] == "2"
        assert r["gathered"] == [0, 1, 2, 3] and r["sum"] == 10


def _local_fn(local_rank: int) -> None:
    return None


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: idist.spawn(launch_fns.add, args=(1,), nprocs=0), "at least 1"),
        (lambda: idist.spawn(launch_fns.add, args=(1,), nprocs=10**20), "more than 1024 processes on one node"),
        (lambda: idist.spawn(launch_fns.add, args=(1,), nprocs=2, nnodes=2, node_rank=2, master_port=1234),
         "node_rank=2 is outside 0..1"),
        (lambda: idist.spawn(launch_fns.add, args=(1,), nprocs=2, nnodes=2), "same master_addr= and master_port="),
        (lambda: idist.spawn(launch_fns.add, args=(1,), master_port=70000), "1..65535"),
        (lambda: idist.spawn(launch_fns.add, args=1), "args must be a tuple"),  # type: ignore[call-overload]
        (lambda: idist.spawn(launch_fns.add, args=(1,), start_method="threads"), "start_method"),  # type: ignore[call-overload]
        (lambda: idist.spawn("mpi", launch_fns.add, (1,)), "mpirun"),
        (lambda: idist.spawn(launch_fns.add, (1,), nprocs=2, nproc_per_node=3), "disagree"),  # type: ignore[call-overload]
    ],
)  # fmt: skip
def test_arguments_that_cannot_work_raise_launch_config_error(call: Any, match: str) -> None:
    with pytest.raises(LaunchConfigError, match=match) as info:
        call()
    assert isinstance(info.value, ValueError)


def test_an_unpicklable_fn_says_how_to_fix_it() -> None:
    with pytest.raises(LaunchError, match="module-level function"):
        idist.spawn(lambda r: r, nprocs=1)
    # a nested function is fine under fork (nothing to pickle)
    if "fork" in __import__("multiprocessing").get_all_start_methods():

        def nested(local_rank: int) -> int:
            return local_rank + 5

        assert idist.spawn(nested, nprocs=2, start_method="fork") == [5, 6]


def test_env_of_the_parent_is_unchanged() -> None:
    before = dict(os.environ)
    # forkserver: the ranks are the server's children, not ours (they are watched all the same)
    assert idist.spawn(launch_fns.add, args=(0,), nprocs=2, start_method="forkserver") == [0, 1]
    assert dict(os.environ) == before
