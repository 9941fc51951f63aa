"""The launch examples run as written, on 2 gloo ranks."""

from __future__ import annotations

import pytest

from launch_util import ROOT, run_py

pytestmark = pytest.mark.timeout(300)


def test_process_management_with_spawn_example() -> None:
    proc = run_py([str(ROOT / "examples" / "spawn_processes.py")], timeout=240)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "[rank 0/2] hello from local rank 0" in out and "[rank 1/2] hello from local rank 1" in out
    assert "results in rank order: [0, 10]" in out
    assert "world sizes seen inside ignite-style spawn: [2, 2]" in out
    assert "caught LaunchError: rank 1 failed with exit code 1" in out
    assert "rank 1 (local rank 1) failed: RuntimeError: rank 1 ran out of luck" in out


def test_custom_communication_example() -> None:
    proc = run_py([str(ROOT / "examples" / "custom_communication.py")], timeout=240)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for r in (0, 1):
        assert f"[rank {r}] all_reduce: grads=[3.0, 3.0, 3.0] mean_loss=0.15000000000000002 max={2**60 + 1}" in out
        assert f"[rank {r}] all_gather: rows=[[0], [0, 1]] names=['wörker-0✓', 'wörker-1✓']" in out
        assert f"[rank {r}] broadcast: config={{'lr': 0.0003, 'epochs': 2}} weights=[0.0, 1.0, 2.0, 3.0]" in out
    assert "[rank 0] group sum over [0]: 100" in out and "[rank 1] group sum over [0]: 101" in out
