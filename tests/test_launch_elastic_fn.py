"""``idist.spawn`` and ``idist.Parallel`` with ``max_restarts=`` / ``nnodes=(MIN, MAX)``: a function on
torch's elastic agent, with real gloo ranks on loopback.

A rank that raises costs one restart; the function runs again, resumes from its checkpoint and
returns the parameters of an uninterrupted run. Bad combinations raise on the user's call.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import elastic_fns
import idist
import launch_fns
from elastic_checks import attempts, finals, free_port, listening, reference, same_model, stalled
from idist.launch import LaunchConfigError, LaunchError
from launch_util import SCRIPTS, clean_env

pytestmark = pytest.mark.timeout(180)


def test_parallel_with_max_restarts_restarts_a_crashed_rank_and_returns_the_same_model(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    reference()  # computed before the snapshot: it initializes idist in this process
    env = dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    with idist.Parallel(backend="gloo", nproc_per_node=2, max_restarts=1) as parallel:
        results = parallel.run(elastic_fns.train, str(tmp_path), 7, 1)
    assert len(results) == 2
    same_model(results)
    assert attempts(tmp_path) == ["attempt0-world2-from0", "attempt1-world2-from6"]  # the last checkpoint: step 6
    err = capfd.readouterr().err
    assert "idist: restart 1 of 1: rank 1 (local rank 1 on node 0) exited with status 1" in err
    assert "RuntimeError: injected failure at step 7" in err
    # nothing of the caller's is left changed: environment, signal handlers
    assert dict(os.environ) == env
    assert {s: signal.getsignal(s) for s in handlers} == handlers


def test_spawn_with_a_node_range_restarts_and_returns_the_same_model(tmp_path: Path) -> None:
    """torch.multiprocessing's form, one node of 1..2 at a rendezvous endpoint on loopback."""
    results = idist.spawn(
        elastic_fns.train_initializing,
        args=(str(tmp_path), 5, 0),
        nprocs=2,
        nnodes=(1, 2),
        master_addr="127.0.0.1",
        master_port=free_port(),
        max_restarts=1,
    )
    same_model(results)
    assert attempts(tmp_path) == ["attempt0-world2-from0", "attempt1-world2-from4"]


def test_the_ranks_store_port_is_held_from_the_rendezvous_until_rank_0_binds_it() -> None:
    """torch's agent only finds a free port for the ranks' store; rank 0 binds it after importing torch,
    seconds later, while any outgoing connection could take it ("Address already in use", seen in CI).
    The agent holds it meanwhile, as a non-elastic launch holds its port."""
    assert idist.spawn(launch_fns.master_port_held, nprocs=1, max_restarts=1) == [True]


def test_a_restart_budget_that_runs_out_raises_launch_error_listing_every_cause(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as info:
        idist.spawn("gloo", elastic_fns.train, (str(tmp_path), 3, 0, True), nproc_per_node=1, max_restarts=1)
    text = str(info.value)
    assert "failed after 1 of 1 restarts" in text, text
    assert text.count("injected failure at step 3") == 2 and "2) rank 0" in text, text
    assert info.value.rank == 0 and info.value.exitcode == 1


BAD = [
    ({"nnodes": (3, 2)}, r"nnodes=\(3, 2\): MIN \(3\) is more than MAX \(2\)"),
    ({"nnodes": (0, 2)}, r"nnodes=\(0, 2\): MIN must be at least 1"),
    ({"max_restarts": -1}, r"max_restarts must be 0 or more"),
    ({"nnodes": (1, 2)}, r"pass the same rendezvous endpoint to every node: master_addr= and master_port="),
    ({"max_restarts": 1, "node_rank": 1}, r"node_rank=1 cannot be elastic.*the rendezvous numbers the nodes"),
    ({"max_restarts": 1, "init_method": "env://"}, r"init_method.*elastic"),
    ({"max_restarts": 1, "start_method": "fork"}, r"start_method='fork'.*elastic"),
    ({"max_restarts": 1, "daemon": True}, r"daemon=True.*elastic"),
]


@pytest.mark.parametrize(("kwargs", "match"), BAD)
def test_bad_elastic_options_raise_on_the_call(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(LaunchConfigError, match=match):
        idist.Parallel("gloo", nproc_per_node=2, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(LaunchConfigError, match=match):
        idist.spawn("gloo", elastic_fns.train, ("x",), nproc_per_node=2, **kwargs)  # type: ignore[call-overload]


def test_elastic_options_that_cannot_apply_raise_on_the_call() -> None:
    with pytest.raises(LaunchConfigError, match=r"join=False.*elastic"):
        idist.spawn(elastic_fns.train_initializing, ("x",), 2, False, max_restarts=1)  # type: ignore[call-overload]
    with pytest.raises(LaunchConfigError, match=r"max_restarts.*horovod"):
        idist.spawn("horovod", elastic_fns.train, ("x",), nproc_per_node=2, max_restarts=1)  # type: ignore[call-overload]
    with pytest.raises(LaunchConfigError, match=r"max_restarts=1 describe processes to spawn"):
        idist.Parallel("gloo", max_restarts=1)


def test_a_lost_node_costs_one_restart_and_the_other_node_returns_the_same_model(tmp_path: Path) -> None:
    """2 nodes x 1 rank, each an ``idist.spawn`` call in its own process; node 1 (its launcher and rank)
    is killed at step 6: node 0 goes on alone from step 4's checkpoint and returns the same model."""
    port = free_port()
    script = str(SCRIPTS / "elastic_spawn_node.py")
    env = clean_env(PYTHONPATH=str(Path(__file__).parent), TMPDIR=str(tmp_path))
    logs = [open(tmp_path / f"node{i}.log", "w") for i in range(2)]
    nodes: list[subprocess.Popen[str]] = []
    try:
        for i, extra in enumerate(({}, {"IDIST_TEST_VICTIM": "1"})):
            args = [sys.executable, script, str(tmp_path), f"127.0.0.1:{port}", "1", "1" if i == 0 else "0", "6", "2"]
            proc = subprocess.Popen(
                args, stdout=logs[i], stderr=subprocess.STDOUT, text=True, env={**env, **extra}, start_new_session=True
            )
            nodes.append(proc)
            if i == 0:
                listening(port)
        (victim,) = stalled(tmp_path, 1)
        os.killpg(nodes[1].pid, signal.SIGKILL)
        os.kill(victim, signal.SIGKILL)  # torch's agent starts each rank in a session of its own
        nodes[1].wait()
        assert nodes[0].wait(timeout=120) == 0, (tmp_path / "node0.log").read_text()
    finally:
        for proc in nodes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for f in logs:
            f.close()
    log = (tmp_path / "node0.log").read_text()
    assert "idist: restart 1 of 1: rank 0" in log, log
    assert attempts(tmp_path)[-1] == "attempt1-world1-from4", attempts(tmp_path)
    same_model(finals(tmp_path, 1))
