"""Elastic jobs across network namespaces, each once through ``idist run`` and once through
``idist.spawn(..., nnodes=..., max_restarts=...)``; node 0 hosts the rendezvous at its own address.

- 2 nodes x 2 ranks, node 1 (launcher, agent and ranks) killed at step 6 while node 0's ranks wait
  on it: node 0 restarts alone, on 2 ranks, from step 4's checkpoint (saved on 4), and ends with
  the parameters of the uninterrupted run;
- node 0 starts alone (1 of 1..2 nodes), node 1 joins: the job ends on 4 ranks with the same model;
- one node, one restart: a rank raises once, the job restarts and ends with the same model; and at
  the same time, on the other node, a restart budget that runs out: the launcher exits 1 and lists
  every restart's cause.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from netns_harness import NodeNet, clean_env

from elastic_checks import attempts, finals, same_model, stalled

TESTS = Path(__file__).resolve().parents[1]
PORT = 29500


def command(
    launcher: str, out: Path, endpoint: str, restarts: int, nnodes: str = "1:2", hold: int = 4, crash: str = ""
) -> list[str]:
    """One node's launcher: 2 ranks; ``crash``: "STEP RANK [always]" (the rank that raises, at that step)."""
    py = sys.executable
    step, rank, *always = crash.split() or ["-1", "0"]
    crashes = ["--crash-step", step, "--crash-rank", rank, *(["--crash-always"] if always else [])]
    if launcher == "idist-run":
        return [py, "-m", "idist", "run", "-n", "2", "--nnodes", nnodes, "--rdzv-endpoint", endpoint,
                "--max-restarts", str(restarts), "--liveness", "2", "--rdzv-timeout", "60",
                str(TESTS / "launch_scripts" / "elastic_train.py"), str(out), "--stall-step", "6",
                "--hold-below", str(hold), *crashes]  # fmt: skip
    script = str(TESTS / "launch_scripts" / "elastic_spawn_node.py")
    return [py, script, str(out), endpoint, "2", str(restarts), "6", str(hold), "--nnodes", nnodes, *crashes]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("launcher", ["idist-run", "spawn"])
def test_a_killed_node_costs_one_restart_and_the_other_ends_with_the_same_model(
    nodes: NodeNet, tmp_path: Path, launcher: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    endpoint = f"{nodes.nodes[0].addr}:{PORT}"
    env = clean_env(PYTHONPATH=str(TESTS), PYTHONUNBUFFERED="1")
    node0 = nodes.start(0, command(launcher, out, endpoint, 1), env, name="node0")
    node1 = nodes.start(1, command(launcher, out, endpoint, 0), {**env, "IDIST_TEST_VICTIM": "1"}, name="node1")
    stalled(out, 2)  # node 1's ranks, at step 6; node 0's wait on them in its all-reduce
    nodes.kill_node(1)
    assert node1.wait(10) is not None
    assert node0.wait(120) == 0, node0.output
    assert "idist: restart 1 of 1: rank" in node0.output, node0.output
    runs = attempts(out)
    assert runs[-1] == "attempt1-world2-from4", runs  # node 0 alone, from the last checkpoint saved on 4 ranks
    same_model(finals(out, 1))
    assert nodes.wait_empty(0, 10) == []


@pytest.mark.timeout(180)
@pytest.mark.parametrize("launcher", ["idist-run", "spawn"])
def test_a_node_that_arrives_later_joins_and_the_job_ends_on_4_ranks_with_the_same_model(
    nodes: NodeNet, tmp_path: Path, launcher: str
) -> None:
    """Node 0 starts alone (1 of 1..2 nodes) and waits at step 1; node 1 joins: the agents restart the
    ranks for it, which costs no restart, and the job ends on 4 ranks."""
    out = tmp_path / "out"
    out.mkdir()
    endpoint = f"{nodes.nodes[0].addr}:{PORT}"
    env = clean_env(PYTHONPATH=str(TESTS), PYTHONUNBUFFERED="1")
    node0 = nodes.start(0, command(launcher, out, endpoint, 0), env, name="node0")
    deadline = time.monotonic() + 90
    while not (out / "attempt0-world2-from0").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    node1 = nodes.start(1, command(launcher, out, endpoint, 0), env, name="node1")
    assert node0.wait(120) == 0, node0.output
    assert node1.wait(60) == 0, node1.output
    assert "a node joins (this does not count as a restart)" in node0.output, node0.output
    assert attempts(out) == ["attempt0-world2-from0", "attempt0-world4-from0"]
    same_model(finals(out, 1 if launcher == "idist-run" else 2))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("launcher", ["idist-run", "spawn"])
def test_one_node_jobs_a_rank_that_raises_once_costs_one_restart_and_a_spent_budget_exits_1(
    nodes: NodeNet, tmp_path: Path, launcher: str
) -> None:
    """Two one-node jobs at once, one a node (``--nnodes 1``, the rendezvous at that node's eth0 address,
    ``--max-restarts 1``), so that their waits overlap:

    - on node 0, rank 1 raises at step 7: the same 2 ranks resume from step 6's checkpoint and the job ends
      with the uninterrupted run's model;
    - on node 1, rank 1 raises at step 3 on every attempt: the one restart is spent, the launcher exits 1
      and its last word lists both failures, each with its rank and its error.
    """
    env = clean_env(PYTHONPATH=str(TESTS), PYTHONUNBUFFERED="1")
    once, spent = tmp_path / "once", tmp_path / "spent"
    jobs = []
    for i, (out, crash) in enumerate(((once, "7 1"), (spent, "3 1 always"))):
        out.mkdir()
        cmd = command(launcher, out, f"{nodes.nodes[i].addr}:{PORT}", 1, nnodes="1", hold=0, crash=crash)
        jobs.append(nodes.start(i, cmd, env, name=out.name))
    node0, node1 = jobs
    cause = "rank 1 (local rank 1 on node 0) exited with status 1"

    assert node0.wait(200) == 0, node0.output
    assert f"idist: restart 1 of 1: {cause}" in node0.output, node0.output
    assert "injected failure at step 7" in node0.output, node0.output
    assert attempts(once) == ["attempt0-world2-from0", "attempt1-world2-from6"]
    same_model(finals(once, 1))

    assert node1.wait(200) == 1, node1.output
    assert f"idist: restart 1 of 1: {cause}" in node1.output, node1.output
    (summary,) = [line for line in node1.output.splitlines() if line.startswith("idist: the job failed")]
    assert summary.startswith(f"idist: the job failed after 1 of 1 restarts; each failure: 1) {cause}"), summary
    assert f"; 2) {cause}" in summary and summary.count("injected failure at step 3") == 2, summary
    assert attempts(spent) == ["attempt0-world2-from0", "attempt1-world2-from2"]
    assert not list(spent.glob("final*.pt"))
    assert nodes.wait_empty(0, 10) == [] and nodes.wait_empty(1, 10) == []
