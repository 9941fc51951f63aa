"""2 nodes x 2 ranks across network namespaces, through each launcher: exact collectives, topology,
training equal to one process, and what listens where.

The four launchers run once per module (``launches``), side by side on the same two nodes (each
job on its own port), nodes whose hostnames resolve to their own addresses (a well-configured
cluster), except for the spawn job: there every node's hostname resolves to 127.0.1.1, as on a
default Debian install (its own hosts file; the others' stay right), and gloo must still bind
eth0. One launch each: Python and torch starting in 24 processes is what these tests cost.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from typing import Any

import pytest
import torch
from netns_harness import LAUNCHERS, NodeNet, clean_env, skip_reason, start_job
from netns_job import training_cases

import idist
from test_training_gloo import EPOCHS, B
from training_cases import train

WORLD = 4
PORT = 29500
#: the launcher whose nodes' hostnames resolve to loopback (127.0.1.1)
LOOPBACK = "spawn"


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("netns-launchers")
    with NodeNet(2, work / "net") as net:
        loopback = {i: net.hosts_resolving_to(i, "127.0.1.1") for i in range(2)}
        args = ["--training", "--timeout", "120"]
        jobs = {
            la: start_job(net, la, work / la, PORT + 10 * k, args, hosts=loopback if la == LOOPBACK else None)
            for k, la in enumerate(LAUNCHERS)
        }
        rcs = {la: job.wait(300) for la, job in jobs.items()}
        left = {i: net.describe(net.wait_empty(i, 5)) for i in range(2)}
        runs = {
            launcher: {
                "launcher": launcher, "rcs": rcs[launcher], "results": job.results(), "errors": job.errors(),
                "logs": job.logs(), "left": left, "addrs": [n.addr for n in net.nodes],
                "launcher_pids": [p.popen.pid for p in job.procs],
            }
            for launcher, job in jobs.items()
        }  # fmt: skip
    return runs


@pytest.fixture(params=LAUNCHERS)
def launched(request: pytest.FixtureRequest, launches: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return launches[request.param]


def _ranks(run: dict[str, Any]) -> dict[int, dict[str, Any]]:
    assert run["rcs"] == [0, 0], f"{run['launcher']}: launchers exited {run['rcs']}\n{run['logs']}"
    results: dict[int, dict[str, Any]] = run["results"]
    assert sorted(results) == list(range(WORLD)), f"missing ranks, errors: {run['errors']}\n{run['logs']}"
    return results


def test_collectives_are_exact_across_nodes(launched: dict[str, Any]) -> None:
    for r, res in _ranks(launched).items():
        assert res["sum_int"] == 10
        assert res["sum_tensor"] == [6, 4 * 2**40 + 6]
        assert res["max_float"] == 1.5
        assert res["sum_float"] == math.fsum(0.1 * (k + 1) for k in range(WORLD))
        assert res["gather_int"] == [0, 1, 2, 3]
        assert res["gather_str"] == ["node0/0", "node0/1", "node1/0", "node1/1"]
        assert res["gather_ragged"] == [[float(i) for i in range(k + 1)] for k in range(WORLD)]
        assert res["bcast_tensor"] == [3.0, 3.0, 3.0]
        assert res["bcast_str"] == "from 2"
        assert res["group_12"] == (5 if r in (1, 2) else r + 1)  # outside the group: the input back
        assert res["group_0_last"] == ([0, 3] if r in (0, 3) else [r])


def test_topology_on_every_rank(launched: dict[str, Any]) -> None:
    for r, res in _ranks(launched).items():
        keys = ("rank", "world_size", "local_rank", "node_rank", "nnodes", "nproc_per_node")
        assert [res[k] for k in keys] == [r, WORLD, r % 2, r // 2, 2, 2]
        assert res["module"] == [r, r % 2, r // 2, 2, 2, WORLD]  # get_rank, get_local_rank, get_node_rank...
        assert res["hostname"] == f"node{r // 2}"


@pytest.fixture(scope="module")
def one_process() -> dict[str, Any]:
    with idist.context("serial") as ctx:
        return {f"{n}-{d}": train(ctx, n, B, EPOCHS, drop_last=d) for n, d in training_cases(WORLD)}


def test_training_equals_one_process(launched: dict[str, Any], one_process: dict[str, Any]) -> None:
    ranks = _ranks(launched)
    for case, single in one_process.items():
        for r, res in ranks.items():
            got = res["training"][case]
            torch.testing.assert_close(
                torch.tensor(got["weights"]), torch.tensor(single["weights"]), rtol=0, atol=1e-5,
                msg=lambda m, r=r, case=case: f"rank {r}, case {case}: {m}",
            )  # fmt: skip
            assert got["rng_untouched"]
        for e in range(EPOCHS):
            seen = [i for res in ranks.values() for i in res["training"][case]["seen"][e]]
            assert len(seen) == len(set(seen)) and sorted(seen) == sorted(single["seen"][e])


def test_no_process_left_on_any_node(launched: dict[str, Any]) -> None:
    _ranks(launched)
    assert launched["left"] == {0: [], 1: []}


#: an ``ss`` listener line; ``pid`` is missing for a socket opened while ``ss`` ran (netns_job reads
#: such a table again, but a socket that keeps appearing can still show no owner)
_SS = re.compile(r"^(?P<addr>\S+):(?P<port>\d+) (?:.*pid=(?P<pid>\d+))?")


def test_listeners_bind_the_interface_that_reaches_master(
    launched: dict[str, Any], launches: dict[str, dict[str, Any]]
) -> None:
    """Every socket idist opens listens on the node's own address (the route to master_addr), not on
    all interfaces (``*``/``0.0.0.0``); under the spawn job, whose hostnames resolve to 127.0.1.1,
    too. Under plain torchrun the agent's store is torch's: only the ranks' sockets are checked
    there. The other jobs' processes on the node are theirs to check."""
    ranks = _ranks(launched)
    own = {str(res["pid"]) for res in ranks.values()}
    if launched["launcher"] != "torchrun":
        own |= {str(pid) for pid in launched["launcher_pids"]}
    others = {str(pid) for run in launches.values() for pid in run["launcher_pids"]} | {
        str(res["pid"]) for run in launches.values() for res in run["results"].values()
    }
    wrong = []
    for r in (0, 2):  # local rank 0 of each node captured its node's socket table
        for line in ranks[r]["ss"]["listen"]:
            m = _SS.match(line)
            assert m, line
            if m["pid"] is not None and m["pid"] not in own and m["pid"] in others:
                continue  # an owner-less listener is held to this job's rule: it may be ours
            if m["addr"] != launched["addrs"][r // 2]:
                wrong.append(f"node{r // 2}: {line}")
    assert not wrong, "listening beyond the interface that reaches master_addr:\n" + "\n".join(wrong)


def test_config_names_the_interface(launched: dict[str, Any]) -> None:
    """show_config (ctx.config) says which interface and address gloo and the store use, and why."""
    for r, res in _ranks(launched).items():
        text = " ".join(f"{k}={v}" for k, v in res["config"].items())
        assert "eth0" in text and launched["addrs"][r // 2] in text, f"rank {r}: {res['config']}"


def test_loopback_hostname_still_joins(launches: dict[str, dict[str, Any]]) -> None:
    """Every node's hostname resolves to 127.0.1.1 (Debian's default) in the spawn job: it still
    joins (its listeners bind eth0: ``test_listeners_bind_the_interface_that_reaches_master``);
    the other jobs saw the well-configured names."""
    for launcher, run in launches.items():
        results = _ranks(run)
        assert all(res["sum_int"] == 10 for res in results.values())
        for r, res in results.items():
            assert res["hostname_addr"] == ("127.0.1.1" if launcher == LOOPBACK else run["addrs"][r // 2]), res


def test_idist_info_shows_topology_and_interface(nodes: NodeNet) -> None:
    """``idist info`` on node 1, in rank 2's environment: the topology and the interface it would use."""
    env = clean_env(
        RANK="2", LOCAL_RANK="0", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2", GROUP_RANK="1",
        MASTER_ADDR=nodes.nodes[0].addr, MASTER_PORT=str(PORT),
    )  # fmt: skip
    r = subprocess.run(nodes.argv(1, [sys.executable, "-m", "idist", "info"]), capture_output=True, text=True,
                       env=env, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "node 1 of 2" in r.stdout and "rank 2 of 4" in r.stdout, r.stdout
    assert "eth0" in r.stdout and nodes.nodes[1].addr in r.stdout, r.stdout
