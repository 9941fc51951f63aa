"""spawn/Parallel with backend="xla-tpu" and launcher detection, on real torch_xla (XLA CPU device).

A launch goes parent → launcher process → torch_xla.launch → one XLA process whose device
threads are the replicas (``CPU_NUM_DEVICES=N``). Runs in the XLA lane; skipped where
torch_xla is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("torch_xla") is None:
    pytest.skip("torch_xla is not installed (the XLA lane runs these)", allow_module_level=True)

import idist
from idist import LaunchError
from launch_util import default_sigint, json_reports, marker_pids, wait_gone

from . import cases_spawn

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("private_tmp")]

TESTS = Path(__file__).resolve().parent.parent
SCRIPT = TESTS / "xla" / "cases_spawn.py"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_LOCAL", "CPU_NUM_DEVICES"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.mark.parametrize("n", [1, 2, 3])
def test_spawn_runs_n_replicas_each_with_its_own_context(n: int) -> None:
    env_before = dict(os.environ)
    results = idist.spawn("xla-tpu", cases_spawn.report, (1.5,), {"scale": 2}, nproc_per_node=n)
    assert [r["rank"] for r in results] == list(range(n))
    for rank, r in enumerate(results):
        assert (r["type"], r["backend"], r["world_size"], r["device"]) == ("XlaContext", "xla-tpu", n, "xla")
        assert r["local_rank_arg"] == rank
        assert r["sum"] == sum(1.5 * (k + 1) for k in range(n)) * 2
        assert r["tensor"] == [float(sum(k + 1 for k in range(n)))]
        assert r["gathered"] == [f"r{k}" for k in range(n)]
        assert r["detected"] == "xla-tpu" and r["launched_by"] == "torch_xla"
    assert len({r["pid"] for r in results}) == 1  # device threads of one XLA process
    assert r["pid"] != os.getpid()
    assert dict(os.environ) == env_before  # PJRT/CPU_NUM_DEVICES were set in the launcher process only


def test_parallel_spawns_replicas() -> None:
    with idist.Parallel(backend="xla-tpu", nproc_per_node=2) as parallel:
        results = parallel.run(cases_spawn.report, 1.0)
        assert isinstance(idist.current(), idist.SerialContext)
    assert [(r["rank"], r["sum"]) for r in results] == [(0, 3.0), (1, 3.0)]


@pytest.mark.parametrize("n", [1, 2])
def test_a_failing_replica_is_named_and_its_xla_process_stopped(tmp_path: Path, n: int) -> None:
    marker = tmp_path / "pid"
    bad = n - 1
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        idist.spawn("xla-tpu", cases_spawn.fail_on, (bad, str(marker)), nproc_per_node=n)
    took = time.monotonic() - start
    err = info.value
    assert (err.rank, err.local_rank, err.exitcode) == (bad, bad, 1), str(err)
    assert err.traceback is not None and f"deliberate failure on rank {bad}" in err.traceback
    assert "ZeroDivisionError" in str(err)
    assert took < 150, took  # the other replica, stuck in the barrier, did not hold the launch
    assert wait_gone(marker_pids(marker, n), 10) == []


def _replicas(out: str) -> list[dict[str, Any]]:
    return sorted(json_reports(out, "IDIST "), key=lambda r: r["index"])  # replicas share stdout


@pytest.mark.parametrize("n", [1, 2])
def test_under_torch_xla_launch_initialize_picks_xla(n: int) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "launch", str(n)], env=_env(), capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = _replicas(proc.stdout)
    assert [r["index"] for r in got] == list(range(n))
    for r in got:
        i = r["index"]
        assert r["detected"] == "xla-tpu" and r["launched_by"] == "torch_xla"
        assert r["context"] == ["XlaContext", "xla-tpu", i, n, sum(range(1, n + 1))]
        assert r["parallel"] == [["XlaContext", i, i]]
        if n == 1:
            assert r["initialize"] == ["XlaContext", "xla-tpu"]


def test_torch_xla_loaded_without_a_launcher_stays_serial() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "plain"], env=dict(_env(), PJRT_DEVICE="CPU"),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json_reports(proc.stdout, "IDIST ") == [["SerialContext", "serial", None]]


def test_ctrl_c_in_the_parent_stops_the_xla_process(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    parent = subprocess.Popen(
        [sys.executable, str(SCRIPT), "sleep", str(marker), "2"],
        env=dict(_env(), TMPDIR=str(tmp_path / "tmp")), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_sigint,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while len(marker_pids(marker, 2)) < 2 and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.2)
        pids = marker_pids(marker, 2)
        assert len(pids) == 2, parent.stderr.read() if parent.poll() is not None and parent.stderr else ""
        parent.send_signal(signal.SIGINT)
        _, err = parent.communicate(timeout=60)
        assert "KeyboardInterrupt" in err, err[-3000:]
        assert wait_gone(pids, 15) == []  # the report folder went too: see the private_tmp fixture
    finally:
        parent.kill()
        parent.communicate()
