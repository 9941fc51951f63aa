"""Liveness across nodes: a lost node is found by heartbeat, not by the collective timeout.

Nobody sets a timeout here: the process group's is torch's 30 minutes. A partition (a switch port
taken down mid-loop, so nothing is reset) must still end every rank on both sides with a typed
error naming the other side within the liveness limit, and every launcher must exit non-zero
(torchrun's agent on the side cut off from its own store excepted: it is torch's); node 0, which
serves the store, may be the one cut off. A node whose launcher is SIGKILLed ends the same way.
A rank that computes for three times the limit is not lost.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from netns_harness import Job, NodeNet, start_job
from test_netns_faults import START, _check_node_failed

PORT = 29500
#: the issue's bound for the default limit (30 s): the limit, a heartbeat round, a slice, a loaded machine
DEFAULT_BOUND = 60.0
SHORT = 5.0


def _looping(nodes: NodeNet, tmp_path: Path, launcher: str, limit: float | None = None) -> Job:
    env = {} if limit is None else {i: {"IDIST_LIVENESS": str(limit)} for i in range(2)}
    job = start_job(nodes, launcher, tmp_path / "out", PORT, ["--work", "loop"], env=env)
    job.wait_beats(4, START)
    time.sleep(0.3)
    return job


def _ends(job: Job, i: int, missing: set[int], since: float, bound: float) -> float:
    """Node i's launcher exits non-zero within ``bound`` s of ``since``; its ranks raised a typed error
    naming exactly ``missing``. Returns how long it took."""
    _check_node_failed(job, i, missing, since, bound)
    ended = job.procs[i].ended
    assert ended is not None
    return ended - since


def _all_gone(nodes: NodeNet) -> None:
    for i in range(2):
        assert nodes.wait_empty(i, 10) == [], f"left on node {i}: {nodes.describe(nodes.pids(i))}"


def test_partition_without_any_timeout_ends_both_nodes_within_a_minute(nodes: NodeNet, tmp_path: Path) -> None:
    """``idist run`` on both nodes, default liveness (30 s), no timeout anywhere: node 1's port goes down."""
    job = _looping(nodes, tmp_path, "idist-run")
    nodes.link(1, False)
    t0 = time.monotonic()
    took = [_ends(job, 0, {2, 3}, t0, DEFAULT_BOUND), _ends(job, 1, {0, 1}, t0, DEFAULT_BOUND)]
    print(f"launchers ended {took[0]:.1f}s and {took[1]:.1f}s after the link went down")
    assert min(took) >= 25.0, f"ended before the liveness limit: {took}\n{job.logs()}"  # not by a timeout
    errors = job.errors()
    assert sorted(errors) == [0, 1, 2, 3], job.logs()
    for rank, err in errors.items():
        assert err["type"] == "PeerLostError", err
        side = "no heartbeat from them" if rank < 2 else f"the store at {nodes.nodes[0].addr}:{PORT} stopped answering"
        assert side in str(err["message"]), err
    _all_gone(nodes)


@pytest.mark.parametrize("launcher", ["spawn", "parallel"])
def test_node0_with_the_store_cut_off_every_launcher_exits_non_zero(
    nodes: NodeNet, tmp_path: Path, launcher: str
) -> None:
    """Node 0's own port goes down (``IDIST_LIVENESS=5``): both sides end within the limit and a margin."""
    job = _looping(nodes, tmp_path, launcher, limit=SHORT)
    nodes.link(0, False)
    t0 = time.monotonic()
    bound = SHORT + 20.0
    _ends(job, 0, {2, 3}, t0, bound)
    _ends(job, 1, {0, 1}, t0, bound)
    assert {e["type"] for e in job.errors().values()} == {"PeerLostError"}, job.logs()
    _all_gone(nodes)


def test_node0_cut_off_under_torchrun_ends_every_rank(nodes: NodeNet, tmp_path: Path) -> None:
    """The same under torchrun: every rank ends with a typed error within the bound and node 0's agent
    exits non-zero. Node 1's agent is torch's: it stays blocked in a call on its rendezvous store (on
    node 0) long after its ranks ended (docs/multinode.md); only it may be left there."""
    job = _looping(nodes, tmp_path, "torchrun", limit=SHORT)
    nodes.link(0, False)
    t0 = time.monotonic()
    bound = SHORT + 20.0
    _ends(job, 0, {2, 3}, t0, bound)
    deadline = t0 + bound
    while len(job.errors()) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    errors = job.errors()
    assert sorted(errors) == [0, 1, 2, 3] and {e["type"] for e in errors.values()} == {"PeerLostError"}, job.logs()
    assert all("ranks [0, 1] did not arrive" in str(errors[r]["message"]) for r in (2, 3)), errors
    assert nodes.wait_empty(0, 10) == [], nodes.describe(nodes.pids(0))
    while time.monotonic() < deadline + 10 and len(nodes.pids(1)) > 1:
        time.sleep(0.2)
    left = nodes.describe(nodes.pids(1))
    assert len(left) <= 1 and all("torch.distributed.run" in p for p in left), left  # no rank left


def test_a_sigkilled_node_launcher_ends_the_other_node(nodes: NodeNet, tmp_path: Path) -> None:
    """SIGKILL to node 1's ``idist run`` alone: its ranks die with it, node 0 ends within the bound."""
    job = _looping(nodes, tmp_path, "idist-run")
    launcher = job.procs[1].popen.pid
    cmdline = Path(f"/proc/{launcher}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "-m idist run" in cmdline, cmdline  # the node's launcher itself (ip netns exec ... execs it)
    os.kill(launcher, signal.SIGKILL)
    t0 = time.monotonic()
    _ends(job, 0, {2, 3}, t0, DEFAULT_BOUND)
    _all_gone(nodes)


def test_a_node_cut_off_from_the_store_inside_ddp_exits_with_its_stack(nodes: NodeNet, tmp_path: Path) -> None:
    """``idist run`` on both nodes, a DDP loop that calls no idist function per step
    (``IDIST_LIVENESS=5``): node 1, which does not serve the store, loses its link. Its ranks wait in
    DDP's backward, which nothing can interrupt, while their store calls never return: each exits 1
    within the limit + 30 s with its main thread's stack, saying the store at node 0's address
    stopped answering. Node 0's ranks, also in backward, name node 1's ranks and exit 1 the same way.
    (Before: node 1's watcher waited in its store call and never looked; node 1 ran on until killed.)"""
    env = {i: {"IDIST_LIVENESS": str(SHORT)} for i in range(2)}
    job = start_job(nodes, "idist-run", tmp_path / "out", PORT, ["--work", "ddp"], env=env)
    job.wait_beats(4, 2 * START)  # DDP's wrapping and first steps on 4 processes
    time.sleep(0.3)
    nodes.link(1, False)
    t0 = time.monotonic()
    bound = SHORT + 30.0
    store = f"{nodes.nodes[0].addr}:{PORT}"
    for i, named, why in ((1, "[0, 1]", f"the store at {store} stopped answering"), (0, "[2, 3]", "no heartbeat")):
        proc = job.procs[i]
        rc = proc.wait(max(0.0, t0 + bound - time.monotonic()))
        out = proc.output
        assert rc is not None, f"node {i} still runs {time.monotonic() - t0:.1f}s after the cut\n{job.logs()}"
        assert rc != 0, out[-3000:]
        assert f"idist.PeerLostError: ranks {named} stopped answering ({why}" in out, out[-3000:]
        assert "main thread (most recent call last)" in out and "backward" in out, out[-3000:]
        assert "waits in torch's own collective above" in out and "exiting with status 1" in out, out[-3000:]
    _all_gone(nodes)


def test_a_rank_computing_for_three_limits_is_not_lost(nodes: NodeNet, tmp_path: Path) -> None:
    """Rank 2 computes for 10 s (``IDIST_LIVENESS=3``) while the 3 others wait in an all_reduce."""
    env = {i: {"IDIST_LIVENESS": "3"} for i in range(2)}
    job = start_job(nodes, "spawn", tmp_path / "out", PORT, ["--work", "slow", "--slow", "10"], env=env)
    rcs = job.wait(START + 60)
    assert rcs == [0, 0], f"launchers: {rcs}; errors: {job.errors()}\n{job.logs()}"
    results = job.results()
    assert sorted(results) == [0, 1, 2, 3], job.logs()
    for res in results.values():
        assert res["first"] == 6 and res["second"] == [6.0] * 3 and res["after"] == [1] * 4, res
    assert min(float(str(r["waited"])) for r in results.values()) >= 9.0, results
    _all_gone(nodes)
