"""``idist run`` elastic jobs on torch's elastic agent, with real gloo ranks on loopback.

A rank that raises, or a node that is lost (its agent and ranks killed), costs one restart;
the job resumes from its last checkpoint on the ranks that remain and ends with the parameters
of an uninterrupted run (one process: global batches make N ranks train like one). Two nodes
are two ``idist run`` agents on this machine meeting at one rendezvous endpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic_checks import attempts, finals, free_port, listening, same_model, stalled
from launch_util import SCRIPTS, alive, clean_env, run_py, wait_gone

pytestmark = pytest.mark.timeout(240)
TRAIN = str(SCRIPTS / "elastic_train.py")
FAST = ["--liveness", "2", "--rdzv-timeout", "60"]


class Agents:
    """``idist run`` agents started by a test, each in its own session; all killed at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.procs = tmp, list[subprocess.Popen[str]]()

    def start(self, args: list[str], name: str, **extra: str) -> subprocess.Popen[str]:
        log = open(self.tmp / f"{name}.log", "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "idist", "run", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env=clean_env(TMPDIR=str(self.tmp), **extra),
            start_new_session=True,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    a = Agents(tmp_path)
    try:
        yield a
    finally:
        a.kill_all()


def test_a_rank_that_raises_once_costs_one_restart_and_the_model_is_the_same(tmp_path: Path) -> None:
    """One node: the same 2 ranks resume from step 6 (another world size: the lost node), a DDP and an
    FSDP model side by side, both ending as the uninterrupted run's. Exactly one restart: an FSDP rank
    that aborted at exit would spend the budget, and the job would fail.

    A liveness limit of 10 s, which costs nothing here (the agent stops rank 0 once rank 1 has exited):
    with 2 s, rank 0 gave up on rank 1 while it still tore its interpreter down (over 2 s for an FSDP
    rank on a loaded machine), and the agent then named rank 1 as killed by its own SIGTERM."""
    args = ["-n", "2", "--max-restarts", "1", "--liveness", "10", "--rdzv-timeout", "60", TRAIN, str(tmp_path)]
    args += ["--strategy", "ddp,fsdp", "--crash-step", "7", "--crash-rank", "1"]
    proc = run_py(["-m", "idist", "run", *args], env=clean_env(TMPDIR=str(tmp_path)), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "idist: restart 1 of 1: rank 1 (local rank 1 on node 0) exited with status 1" in proc.stderr
    assert "RuntimeError: injected failure at step 7" in proc.stderr
    assert attempts(tmp_path) == ["attempt0-world2-from0", "attempt1-world2-from6"]  # the last checkpoint: step 6
    same_model(finals(tmp_path, 1), ("ddp", "fsdp"))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("idist-elastic")]  # its logs are removed


def test_a_restart_budget_that_runs_out_exits_non_zero_listing_every_cause(tmp_path: Path) -> None:
    args = ["-n", "1", "--max-restarts", "1", *FAST, TRAIN, str(tmp_path), "--crash-step", "3", "--crash-always"]
    proc = run_py(["-m", "idist", "run", *args], env=clean_env(TMPDIR=str(tmp_path)), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "idist: restart 1 of 1: rank 0 (local rank 0 on node 0) exited with status 1" in proc.stderr
    summary = proc.stderr.splitlines()[-1]
    assert summary.startswith("idist: the job failed after 1 of 1 restarts; each failure: 1) rank 0"), summary
    assert summary.count("injected failure at step 3") == 2 and "2) rank 0" in summary


def test_a_rank_that_raised_is_named_with_its_own_exit_even_when_a_peer_is_out_first(tmp_path: Path) -> None:
    """Rank 1 raises but exits slowly; rank 0, ending on the lost peer, is out first. The agent lets rank 1
    finish exiting instead of stopping it with SIGTERM: the cause is its own status and error, and the
    job's exit status 1, not 143."""
    args = ["-n", "2", "--max-restarts", "1", *FAST, str(SCRIPTS / "slow_exit.py")]
    proc = run_py(["-m", "idist", "run", *args], env=clean_env(TMPDIR=str(tmp_path)), cwd=tmp_path)
    cause = "rank 1 (local rank 1 on node 0) exited with status 1 (and 1 more rank of this node): RuntimeError: rank 1"
    assert f"idist: restart 1 of 1: {cause}" in proc.stderr, proc.stderr
    assert proc.returncode == 1, proc.stderr
    assert "SIGTERM" not in proc.stderr


def test_a_lost_node_costs_one_restart_and_the_rest_finish_with_the_same_model(tmp_path: Path, agents: Agents) -> None:
    """2 nodes x 2 ranks, a DDP and an FSDP model side by side; node 1 (agent and ranks) is killed at step 6
    while node 0's ranks save that step's checkpoint: it is never published, and node 0 goes on with 2 ranks
    from step 4's (saved on 4 ranks; the FSDP model resharded from 4 shards to 2). One restart only: an FSDP
    rank that aborted at exit ("terminate called without an active exception") would need a second.
    """
    port = free_port()
    common = ["-n", "2", "--nnodes", "1:2", "--master-addr", "127.0.0.1", "--master-port", str(port), *FAST]
    job = [TRAIN, str(tmp_path), "--strategy", "ddp,fsdp", "--stall-step", "6"]
    node0 = agents.start([*common, "--max-restarts", "1", *job, "--hold-below", "4"], "node0")
    listening(port)
    node1 = agents.start([*common, *job], "node1", IDIST_TEST_VICTIM="1")
    ranks = stalled(tmp_path, 2)
    os.killpg(node1.pid, signal.SIGKILL)
    for pid in ranks:  # the node's ranks (torch's agent starts each in its own session)
        os.kill(pid, signal.SIGKILL)
    node1.wait()
    assert node0.wait(timeout=120) == 0, agents.log("node0")
    log = agents.log("node0")
    # on loopback the killed ranks' sockets close at once (on a real network, idist's liveness limit ends them)
    assert "idist: restart 1 of 1: rank" in log and ("PeerLostError" in log or "closed by peer" in log), log
    # node 0 may start alone first (node 1 arrived after the rendezvous' last call): it waits at step 1
    assert attempts(tmp_path) in (
        ["attempt0-world4-from0", "attempt1-world2-from4"],
        ["attempt0-world2-from0", "attempt0-world4-from0", "attempt1-world2-from4"],
    )
    same_model(finals(tmp_path, 1), ("ddp", "fsdp"))
    assert wait_gone(ranks) == [] and not alive(node1.pid)


def test_a_node_that_arrives_later_joins_at_the_next_restart(tmp_path: Path, agents: Agents) -> None:
    """Node 0 starts alone with --nnodes 1:2 and stalls at step 3; node 1 joins; the job resumes from step 2's
    checkpoint and finishes on 2 ranks, no restart spent (1 rank a node: the namespace test joins 2 ranks to 2)."""
    port = free_port()
    common = ["-n", "1", "--nnodes", "1:2", "--rdzv-endpoint", f"127.0.0.1:{port}", *FAST]
    node0 = agents.start([*common, TRAIN, str(tmp_path), "--stall-step", "3", "--stall-below", "2"], "node0")
    stalled(tmp_path, 1)
    node1 = agents.start([*common, TRAIN, str(tmp_path)], "node1")
    assert node0.wait(timeout=120) == 0, agents.log("node0")
    assert node1.wait(timeout=60) == 0, agents.log("node1")
    assert "a node joins (this does not count as a restart)" in agents.log("node0")
    assert attempts(tmp_path) == ["attempt0-world1-from0", "attempt0-world2-from2"]  # the restart count stays 0
    same_model(finals(tmp_path, 1))


def test_torchrun_restarts_an_idist_script_in_its_agents_store(tmp_path: Path) -> None:
    """torchrun's agent keeps its store across restarts: the restarted ranks must not read the first
    attempt's keys (they waited for ever for peers that had left)."""
    args = ["--standalone", "--nproc_per_node", "2", "--max-restarts", "1", "--monitor-interval", "0.2"]
    args += [TRAIN, str(tmp_path), "--crash-step", "7", "--crash-rank", "1"]
    proc = run_py(["-m", "torch.distributed.run", *args], env=clean_env(TMPDIR=str(tmp_path)), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert attempts(tmp_path) == ["attempt0-world2-from0", "attempt1-world2-from6"]
    same_model(finals(tmp_path, 1))
