"""The idist CLI: `idist run` through torch.distributed.run, `idist info`, `python -m idist`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from idist.launch import reserve_port
from launch_util import SCRIPTS, clean_env, run_py, run_together

pytestmark = pytest.mark.timeout(300)
REPORT = str(SCRIPTS / "report.py")


def _reports(stdout: str) -> list[tuple[str, dict[str, Any]]]:
    """(prefix, JSON) for every line of the form ``[rankN]:{...}``."""
    out = []
    for line in stdout.splitlines():
        prefix, sep, rest = line.partition(":")
        if sep and rest.startswith("{"):
            out.append((prefix, json.loads(rest)))
    return sorted(out, key=lambda pr: pr[1]["rank"])


def _ipv6_loopback() -> bool:
    try:
        with socket.create_server(("::1", 0), family=socket.AF_INET6):
            return True
    except OSError:
        return False


def test_the_launcher_itself_never_imports_torch(tmp_path: Path) -> None:
    # it only starts processes: torch is the ranks' import, and the launcher starts at once
    script = tmp_path / "hello.py"
    script.write_text("import os\nprint('rank', os.environ['RANK'])\n")
    launcher = (
        "import sys\nfrom idist._cli import main\nrc = main(['run', '-n', '2', sys.argv[1]])\n"
        "print('launcher imported torch:', 'torch' in sys.modules)\nsys.exit(rc)\n"
    )
    proc = run_py(["-c", launcher, str(script)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "launcher imported torch: False" in proc.stdout, proc.stdout
    assert sorted(line for line in proc.stdout.splitlines() if "rank " in line) == ["[rank0]:rank 0", "[rank1]:rank 1"]


def test_run_prefixes_every_line_with_its_rank_and_passes_arguments(tmp_path: Path) -> None:
    # an IPv6 master address, where this machine has IPv6 loopback (IPv4's, the default, is in every other run)
    ipv6 = ["--master-addr", "::1"] if _ipv6_loopback() else []
    env = clean_env(TMPDIR=str(tmp_path))
    proc = run_py(["-m", "idist", "run", "-n", "2", *ipv6, REPORT, "a", "--", "b"], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = _reports(proc.stdout)
    assert [p for p, _ in reports] == ["[rank0]", "[rank1]"]
    for rank, (_, r) in enumerate(reports):
        assert (r["rank"], r["world_size"], r["local_rank"], r["launcher"]) == (rank, 2, rank, "torchrun")
        assert r["args"] == ["a", "b"] and r["gathered"] == [0, 1] and r["sum"] == 3
    assert list(tmp_path.iterdir()) == []  # the tee'd logs are removed


@pytest.mark.parametrize(("how", "status", "says"), [("exit7", 7, "exited with code 7"),
                                                     ("sigkill", 128 + 9, "was killed by SIGKILL")])  # fmt: skip
def test_run_exits_with_the_status_of_the_first_failing_rank(how: str, status: int, says: str) -> None:
    proc = run_py(["-m", "idist", "run", "-n", "2", REPORT, "--fail-rank", "1", "--how", how])
    assert proc.returncode == status, proc.stderr
    assert f"idist run: rank 1 (local rank 1) {says}" in proc.stderr


_FAIL_THEN_PEER = """
import os, sys, time, pathlib
out = pathlib.Path(sys.argv[1])
if os.environ["LOCAL_RANK"] == "1":
    (out / "rank1-failed").write_text("")
    sys.exit("rank 1 failed first")
while not (out / "rank1-failed").exists():
    time.sleep(0.01)
time.sleep(0.3)
sys.exit("rank 0 failed because rank 1 did")
"""


def test_a_rank_failing_just_after_the_first_still_reports_its_own_error(tmp_path: Path) -> None:
    """Ranks usually fail together (a peer lost, a store gone): the others get a moment to end on
    their own, with their own message, before they are stopped; the first sets the status."""
    script = tmp_path / "fail_then_peer.py"
    script.write_text(_FAIL_THEN_PEER)
    proc = run_py(["-m", "idist", "run", "-n", "2", str(script), str(tmp_path)])
    assert proc.returncode == 1, proc.stderr
    assert "idist run: rank 1 (local rank 1) exited with code 1; stopped the others" in proc.stderr
    assert "rank 1 failed first" in proc.stderr
    assert "rank 0 failed because rank 1 did" in proc.stderr, proc.stderr


def test_run_multi_node_on_one_host_through_the_cli() -> None:
    with reserve_port() as reservation:
        port = str(reservation.port)
        cmd = [sys.executable, "-m", "idist", "run", "-n", "2", "--nnodes", "2", "--master-port", port]
        done = run_together([[*cmd, "--node-rank", str(k), REPORT] for k in (0, 1)], [clean_env()] * 2, timeout=240)
    assert [p.returncode for p in done] == [0, 0], [p.stderr for p in done]
    reports = _reports(done[0].stdout + done[1].stdout)
    assert [p for p, _ in reports] == ["[rank0]", "[rank1]", "[rank2]", "[rank3]"]
    for rank, (_, r) in enumerate(reports):
        assert (r["world_size"], r["nnodes"], r["node_rank"], r["local_rank"]) == (4, 2, rank // 2, rank % 2)
        assert r["gathered"] == [0, 1, 2, 3] and r["sum"] == 10


def test_a_refused_flag_ends_the_real_command_with_status_2_before_any_rank_starts() -> None:
    """The checks themselves run in process (tests/test_launch_args.py); here, once, the command."""
    proc = run_py(["-m", "idist", "run", "-n", "2", "--liveness=nan", REPORT], timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("idist: error: --liveness: liveness must be a number of seconds >= 0"), proc.stderr
    assert "[rank" not in proc.stderr + proc.stdout  # refused before any rank started


def test_info_shows_the_detected_launcher_and_the_variables_that_decided_it() -> None:
    env = clean_env(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29999")
    proc = run_py(["-m", "idist", "info"], timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "launcher: torchrun" in proc.stdout
    assert "rank 1 of 2" in proc.stdout and "RANK=1" in proc.stdout and "WORLD_SIZE=2" in proc.stdout
    assert "MASTER_PORT=29999" in proc.stdout


def test_the_console_script_is_installed_and_info_lists_backends_and_devices_without_a_launcher() -> None:
    exe = Path(sys.executable).parent / "idist"
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "idist"]
    proc = subprocess.run([*command, "info"], capture_output=True, text=True, timeout=120, check=False, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    assert "backends available: serial, gloo" in proc.stdout
    assert "launcher: none detected" in proc.stdout
    assert "devices:" in proc.stdout and "cpu" in proc.stdout
    if not exe.exists():
        pytest.skip(f"no console script at {exe}: reinstall with pip install -e .")
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and "run" in proc.stdout and "info" in proc.stdout


def test_parallel_under_idist_run_says_idist_run_started_it() -> None:
    proc = run_py(["-m", "idist", "run", "-n", "2", str(SCRIPTS / "parallel_report.py"), "--ask-for-procs", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    refusals = [json.loads(line.split(":", 1)[1]) for line in proc.stdout.splitlines() if '"refused"' in line]
    assert len(refusals) == 2, proc.stdout
    assert all("this process was started by idist run, which" in r["refused"] for r in refusals), refusals
    # then, in the same processes, Parallel() without a process count initializes in place
    lines = [json.loads(line.split(":", 1)[1]) for line in proc.stdout.splitlines() if ':{"tag"' in line]
    reports = sorted(lines, key=lambda r: r["rank"])
    assert [(r["rank"], r["world_size"], r["launcher"], r["sum"]) for r in reports] == [
        (0, 2, "torchrun", 30), (1, 2, "torchrun", 30)
    ], proc.stdout  # fmt: skip
