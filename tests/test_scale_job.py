"""A real 32-rank job on one machine, as users start it: ``idist run -n 32`` with checked mode,
the heartbeat on, DDP and a checkpoint saved and loaded (the big-N costs are measured in
benchmarks/bench_scale.py, not here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch_util import SCRIPTS, run_py

pytestmark = pytest.mark.timeout(900)


def test_idist_run_n_32_checked_with_liveness_saves_and_loads(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    cmd = ["-m", "idist", "run", "-n", "32", "--checked", "--liveness", "10", str(SCRIPTS / "job32.py"), str(ckpt)]
    proc = run_py(cmd, timeout=840)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    line = next(x for x in proc.stdout.splitlines() if "JOB32 " in x)
    report = json.loads(line.split("JOB32 ", 1)[1])
    assert report["world_size"] == 32 and report["sum"] == sum(range(32)) and report["half"] == 16, report
    assert "failed on rank 31" in report["shipped"] and "got 99" in report["shipped"], report  # checked mode
    assert report["watching"] == ["idist-liveness", "idist-liveness-store"], report
    assert report["loaded"] == [1] * 32, report
    assert (ckpt / "idist.json").is_file()
