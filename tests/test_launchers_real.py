"""Real launchers start the scripts; initialize() and Parallel pick up rank and world size.

torchrun always; ``mpirun`` from Debian's openmpi-bin and a one-node SLURM (slurmctld +
slurmd + munge on localhost, started for this module and stopped after) when
``scripts/setup-system.sh`` could install them; the tests say why when they skip.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launch_util import SCRIPTS, clean_env, json_reports, run_together
from multiproc import free_port

pytestmark = pytest.mark.timeout(300)
PY = sys.executable
REPORT = str(SCRIPTS / "report.py")
PARALLEL = str(SCRIPTS / "parallel_report.py")
SETUP_HINT = "run scripts/setup-system.sh (needs root and apt-get)"


def _json_lines(stdout: str) -> list[dict[str, Any]]:
    return sorted(json_reports(stdout), key=lambda r: r.get("rank", 0))  # mpirun merges the ranks' stdout


def _run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env or clean_env())


def _check_world(reports: list[dict[str, Any]], launcher: str) -> None:
    assert [r["rank"] for r in reports] == [0, 1], reports
    for r in reports:
        assert (r["world_size"], r["local_rank"], r["launcher"]) == (2, r["rank"], launcher)
        assert r["gathered"] == [0, 1]


# ------------------------------------------------------------------ torchrun
def test_parallel_refuses_a_process_count_under_torchrun_then_initializes_in_place(tmp_path: Path) -> None:
    # TMPDIR: torchrun leaves a torchelastic_* log directory in the temporary directory
    env = clean_env(TMPDIR=str(tmp_path))
    proc = _run(
        [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", PARALLEL, "--ask-for-procs", "2"],
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    lines = _json_lines(proc.stdout)
    refusals = [r for r in lines if "refused" in r]
    assert len(refusals) == 2 and all("started by torchrun" in r["refused"] for r in refusals), lines
    reports = [r for r in lines if "refused" not in r]
    _check_world(reports, "torchrun")
    for r in reports:
        assert r["type"] == "NativeContext" and r["tag"] == "in-place" and r["sum"] == 30
        assert r["local_rank_arg"] == r["local_rank"] and r["after_exit"] == "SerialContext"


# -------------------------------------------------------------------- mpirun
def _mpirun() -> list[str]:
    exe = shutil.which("mpirun")
    if exe is None:
        pytest.skip(f"mpirun (openmpi-bin) is not installed: {SETUP_HINT}")
    return [exe, "--allow-run-as-root", "--oversubscribe", "-n", "2"]


def test_initialize_picks_up_rank_and_world_size_under_mpirun() -> None:
    proc = _run([*_mpirun(), PY, REPORT])
    assert proc.returncode == 0, proc.stderr
    reports = _json_lines(proc.stdout)
    _check_world(reports, "openmpi")
    assert all(r["sum"] == 3 and r["nproc_per_node"] == 2 and r["backend"] == "gloo" for r in reports)


def test_parallel_initializes_in_place_under_mpirun() -> None:
    proc = _run([*_mpirun(), PY, PARALLEL])
    assert proc.returncode == 0, proc.stderr
    reports = _json_lines(proc.stdout)
    _check_world(reports, "openmpi")
    assert all(r["sum"] == 30 for r in reports)


# --------------------------------------------------------------------- SLURM
def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _slurm_conf(d: Path, host: str, first_job: int) -> str:
    return f"""\
ClusterName=idist
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
FirstJobId={first_job}
NodeName={host} CPUs={os.cpu_count() or 1} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""


def _stop(pidfile: Path) -> None:
    try:
        pid = int(pidfile.read_text())
    except (FileNotFoundError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A one-node SLURM cluster on this host for this module; its environment for srun."""
    tools = [t for t in ("munged", "slurmctld", "slurmd", "srun") if shutil.which(t) is None]
    if tools:
        pytest.skip(f"slurm-wlm/munge not installed ({', '.join(tools)} missing): {SETUP_HINT}")
    if os.geteuid() != 0:
        pytest.skip("the one-node SLURM test runs its daemons as root")
    d = tmp_path_factory.mktemp("slurm")
    (d / "state").mkdir()
    (d / "spool").mkdir()
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host = socket.gethostname()
    # The first job's id decides its rendezvous port (15000 + id % 20000): pick a free one.
    first = next(j for j in (random.randrange(1, 20000) for _ in range(100)) if _port_is_free(15000 + j))
    conf = d / "slurm.conf"
    conf.write_text(_slurm_conf(d, host, first))
    env = clean_env(SLURM_CONF=str(conf))
    pidfiles = [d / "slurmd.pid", d / "slurmctld.pid", d / "munged.pid"]
    try:
        subprocess.run(["munged", f"--key-file={key}", f"--socket={d}/munge.sock", f"--pid-file={d}/munged.pid",
                        f"--log-file={d}/munged.log", f"--seed-file={d}/munge.seed", "-f"],
                       check=True, env=env, timeout=30, capture_output=True)  # fmt: skip
        subprocess.run(["slurmctld", "-f", str(conf)], check=True, env=env, timeout=30, capture_output=True)
        subprocess.run(["slurmd", "-f", str(conf)], check=True, env=env, timeout=30, capture_output=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, check=False)
            if out.stdout.strip() == "idle":
                break
            time.sleep(0.5)
        else:
            pytest.skip(
                f"slurmd did not come up in this sandbox (sinfo: {out.stdout.strip()!r} {out.stderr.strip()!r})"
            )
        yield env
    except subprocess.CalledProcessError as e:
        pytest.skip(f"SLURM daemons cannot run here: {e.cmd[0]} failed: {e.stderr!r}")
    finally:
        for p in pidfiles:
            _stop(p)


def test_initialize_picks_up_rank_and_world_size_under_srun(slurm: dict[str, str]) -> None:
    proc = _run(["srun", "-n", "2", PY, REPORT], env=slurm)
    assert proc.returncode == 0, proc.stderr
    reports = _json_lines(proc.stdout)
    _check_world(reports, "slurm")
    assert all(r["sum"] == 3 and r["nproc_per_node"] == 2 and r["nnodes"] == 1 for r in reports)


def test_parallel_initializes_in_place_under_srun(slurm: dict[str, str]) -> None:
    proc = _run(["srun", "-n", "2", PY, PARALLEL], env=slurm)
    assert proc.returncode == 0, proc.stderr
    _check_world(_json_lines(proc.stdout), "slurm")


def test_the_exact_variables_srun_sets_are_enough() -> None:
    """What `srun -n 2` exported on one node here (slurm-wlm 22.05), without the daemons.

    No MASTER_* variables: the address is the first host of the node list and the port
    comes from the job id (15000 + id % 20000), so the job id is picked to give a free port.
    """
    job = next(j for j in (random.randrange(1, 20000) for _ in range(100)) if _port_is_free(15000 + j))
    envs = [
        clean_env(
            SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank), SLURM_NODEID="0", SLURM_NTASKS="2",
            SLURM_NPROCS="2", SLURM_NNODES="1", SLURM_JOB_NODELIST=socket.gethostname(), SLURM_JOB_ID=str(job),
            SLURM_TASKS_PER_NODE="2", SLURM_STEP_NUM_TASKS="2", SLURM_STEP_TASKS_PER_NODE="2",
            SLURM_JOB_NUM_NODES="1", SLURM_NODELIST=socket.gethostname(),
        )
        for rank in range(2)
    ]  # fmt: skip
    done = run_together([[PY, REPORT]] * 2, envs, timeout=180)
    assert [p.returncode for p in done] == [0, 0], [p.stderr for p in done]
    _check_world(_json_lines(done[0].stdout + done[1].stdout), "slurm")
