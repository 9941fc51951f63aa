"""initialize() under a real torchrun detects rank, world size and local rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent


def _run(cmd: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    # torchrun writes its log directory under TMPDIR: keep it inside the test's tmp_path
    env = dict(os.environ, TMPDIR=str(tmp))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, env=env)


def test_initialize_detects_torchrun(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(HERE / "scripts" / "report_env.py"), str(tmp_path)]  # fmt: skip
    proc = _run(cmd, tmp_path)
    assert proc.returncode == 0, proc.stderr
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in reports] == [0, 1]
    for r in reports:
        assert r["type"] == "NativeContext" and r["backend"] == "gloo" and r["launcher"] == "torchrun"
        assert r["world_size"] == 2 and r["local_rank"] == r["rank"] and r["nproc_per_node"] == 2
        assert r["gathered"] == [0, 1] and r["sum"] == 3


def test_collectives_demo_runs_under_torchrun(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "examples" / "collectives_demo.py")]  # fmt: skip
    proc = _run(cmd, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("-> [3.0]") == 2
    assert proc.stdout.count("['héllo✓', 'héllo✓héllo✓']") == 2
