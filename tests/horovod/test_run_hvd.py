"""``idist run --backend horovod`` ended by a signal, even SIGKILL: horovodrun, its ranks and what they
started all end (the lane's venv has horovodrun on PATH)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch_util import alive, default_sigint, wait_gone, wait_markers

HERE = Path(__file__).parent


def _job_processes(mark: Path) -> list[int]:
    """Every live process whose command line names ``mark`` (horovodrun, its helpers, the ranks)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(mark).encode() in cmdline and entry.name.isdigit() and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_horovod_job_ends_whole_with_its_launcher(tmp_path: Path, sig: signal.Signals) -> None:
    mark = tmp_path / "m"
    cmd = [sys.executable, "-m", "idist", "run", "--backend", "horovod", "-n", "2", str(HERE / "hvd_sleeper.py"),
           str(mark)]  # fmt: skip
    launcher = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=default_sigint)
    try:
        ranks = wait_markers(mark, 2, timeout=180)
        while not all(Path(f"{mark}.{r}.child").exists() for r in range(2)):
            time.sleep(0.05)
        children = [int(Path(f"{mark}.{r}.child").read_text()) for r in range(2)]
        job = _job_processes(mark)
        assert len(job) >= 3, job  # horovodrun and the two ranks at least
        launcher.send_signal(sig)
        launcher.wait(60)
        # horovod gives its ranks 5 s after SIGTERM before it kills them
        assert wait_gone(ranks + children + job, timeout=30) == [], _job_processes(mark)
    finally:
        launcher.kill()
        launcher.wait()
