"""Liveness across nodes: a lost node is found by heartbeat, not by the collective timeout.

Nobody sets a timeout here: the process group's is torch's 30 minutes. A partition (a switch port
taken down mid-loop, so nothing is reset) must still end every rank on both sides with a typed
error naming the other side within the liveness limit, and every launcher must exit non-zero
(torchrun's agent on the side cut off from its own store excepted: it is torch's); node 0, which
serves the store, may be the one cut off. A node whose launcher is SIGKILLed ends the same way.
A rank that computes for three times the limit is not lost. Jobs whose faults leave each other
alone run side by side (a pair of nodes each, or one fault for all), so their waits overlap.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from netns_harness import Job, NodeNet, start_job
from test_netns_faults import START, _check_node_failed

PORT = 29500
#: the issue's bound for the default limit (30 s): the limit, a heartbeat round, a slice, a loaded machine
DEFAULT_BOUND = 60.0
SHORT = 5.0


def _start(nodes: NodeNet, out: Path, launcher: str, limit: float | None = None, port: int = PORT) -> Job:
    env = {} if limit is None else {i: {"IDIST_LIVENESS": str(limit)} for i in range(2)}
    return start_job(nodes, launcher, out, port, ["--work", "loop"], env=env)


def _looping(nodes: NodeNet, tmp_path: Path, launcher: str, limit: float | None = None) -> Job:
    job = _start(nodes, tmp_path / "out", launcher, limit)
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
    for i in range(len(nodes.nodes)):
        assert nodes.wait_empty(i, 10) == [], f"left on node {i}: {nodes.describe(nodes.pids(i))}"


def test_partition_and_a_sigkilled_launcher_without_any_timeout_end_every_node(nodes4: NodeNet, tmp_path: Path) -> None:
    """Two ``idist run`` jobs, default liveness (30 s), no timeout anywhere: job P on nodes 0 and 1,
    job K beside it on nodes 2 and 3. Node 1's port goes down: both sides of P end within a minute,
    not before the limit. SIGKILL to node 3's ``idist run`` alone: its ranks die with it and node 2
    ends within the bound."""
    part = _start(nodes4, tmp_path / "p", "idist-run")
    killed = start_job(nodes4, "idist-run", tmp_path / "k", PORT, ["--work", "loop"], nodes=(2, 3))
    for job in (part, killed):
        job.wait_beats(4, 2 * START)  # 12 processes start side by side
    time.sleep(0.3)
    nodes4.link(1, False)
    t0 = time.monotonic()
    launcher = killed.procs[1].popen.pid
    cmdline = Path(f"/proc/{launcher}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "-m idist run" in cmdline, cmdline  # the node's launcher itself (ip netns exec ... execs it)
    os.kill(launcher, signal.SIGKILL)
    t1 = time.monotonic()
    _ends(killed, 0, {2, 3}, t1, DEFAULT_BOUND)
    took = [_ends(part, 0, {2, 3}, t0, DEFAULT_BOUND), _ends(part, 1, {0, 1}, t0, DEFAULT_BOUND)]
    print(f"launchers ended {took[0]:.1f}s and {took[1]:.1f}s after the link went down")
    assert min(took) >= 25.0, f"ended before the liveness limit: {took}\n{part.logs()}"  # not by a timeout
    errors = part.errors()
    assert sorted(errors) == [0, 1, 2, 3], part.logs()
    for rank, err in errors.items():
        assert err["type"] == "PeerLostError", err
        side = "no heartbeat from them" if rank < 2 else f"the store at {nodes4.nodes[0].addr}:{PORT} stopped answering"
        assert side in str(err["message"]), err
    _all_gone(nodes4)


def test_node0_with_the_store_cut_off_every_launcher_exits_non_zero(nodes: NodeNet, tmp_path: Path) -> None:
    """spawn, Parallel and torchrun side by side (``IDIST_LIVENESS=5``, a port each); node 0's own
    port goes down: every rank of every job ends with a typed error within the limit and a margin,
    and every launcher exits non-zero, except torchrun's agent on node 1, which is torch's: it
    stays blocked in a call on its rendezvous store (on node 0) long after its ranks ended
    (docs/multinode.md); only it may be left there."""
    launchers = ("spawn", "parallel", "torchrun")
    jobs = {la: _start(nodes, tmp_path / la, la, SHORT, PORT + 10 * k) for k, la in enumerate(launchers)}
    for job in jobs.values():
        job.wait_beats(4, len(jobs) * START)  # 18 processes start side by side
    time.sleep(0.3)
    nodes.link(0, False)
    t0 = time.monotonic()
    bound = SHORT + 20.0
    for la in ("spawn", "parallel"):
        _ends(jobs[la], 0, {2, 3}, t0, bound)
        _ends(jobs[la], 1, {0, 1}, t0, bound)
        assert {e["type"] for e in jobs[la].errors().values()} == {"PeerLostError"}, jobs[la].logs()
    job = jobs["torchrun"]
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


def test_a_node_cut_off_inside_ddp_exits_with_its_stack_and_a_computing_rank_is_not_lost(
    nodes4: NodeNet, tmp_path: Path
) -> None:
    """``idist run`` on nodes 0 and 1, a DDP loop that calls no idist function per step
    (``IDIST_LIVENESS=5``): node 1, which does not serve the store, loses its link. Its ranks wait in
    DDP's backward, which nothing can interrupt, while their store calls never return: each exits 1
    within the limit + 30 s with its main thread's stack, saying the store at node 0's address
    stopped answering. Node 0's ranks, also in backward, name node 1's ranks and exit 1 the same way.
    (Before: node 1's watcher waited in its store call and never looked; node 1 ran on until killed.)
    Beside it, on nodes 2 and 3 (``IDIST_LIVENESS=3``), a spawn job's rank 2 computes for 10 s
    while the 3 others wait in an all_reduce: it is not lost."""
    nodes = nodes4
    env = {i: {"IDIST_LIVENESS": str(SHORT)} for i in range(2)}
    job = start_job(nodes, "idist-run", tmp_path / "out", PORT, ["--work", "ddp"], env=env)
    # beside it, on nodes 2 and 3: rank 2 computes for 10 s (three limits) while the others wait
    slow_env = {i: {"IDIST_LIVENESS": "3"} for i in (2, 3)}
    slow = start_job(nodes, "spawn", tmp_path / "slow", PORT, ["--work", "slow", "--slow", "10"], env=slow_env,
                     nodes=(2, 3))  # fmt: skip
    job.wait_beats(4, 3 * START)  # DDP's wrapping and first steps, 12 processes side by side
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
        assert proc.ended is not None and proc.ended - t0 <= bound, f"node {i} exited too late\n{job.logs()}"
        print(f"node {i} exited {proc.ended - t0:.1f}s after the cut (bound {bound}s)")
        assert rc != 0, out[-3000:]
        assert f"idist.PeerLostError: ranks {named} stopped answering ({why}" in out, out[-3000:]
        assert "main thread (most recent call last)" in out and "backward" in out, out[-3000:]
        assert "waits in torch's own collective above" in out and "exiting with status 1" in out, out[-3000:]
    rcs = slow.wait(START + 60)
    assert rcs == [0, 0], f"launchers: {rcs}; errors: {slow.errors()}\n{slow.logs()}"
    results = slow.results()
    assert sorted(results) == [0, 1, 2, 3], slow.logs()
    for res in results.values():
        assert res["first"] == 6 and res["second"] == [6.0] * 3 and res["after"] == [1] * 4, res
    assert min(float(str(r["waited"])) for r in results.values()) >= 9.0, results
    _all_gone(nodes)
