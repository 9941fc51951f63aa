"""What a restart costs: seconds from a failure to the first training step after the resume.

Two cases, each run ``--rounds`` times on loopback with gloo (2 ranks a node):

* crash, one node: rank 1 raises at step 7; ``idist run -n 2 --max-restarts 1`` side by side
  with raw ``torchrun --standalone --nproc_per_node 2 --max-restarts 1 --monitor-interval 0.1``
  (torch's agent with torch's own settings), rounds interleaved;
* lost node: two ``idist run -n 2 --nnodes 1:2`` agents; at step 5 the second node (agent and
  ranks) is killed with SIGKILL and the first goes on with 2 ranks.

Each restart is split into: *detect* (the failure, or the kill, to the line of torch's agent
that a rank failed, as it reaches the benchmark), *restart* (to the first line of the new
attempt's script: stopping the ranks, the rendezvous, starting Python), *init* (imports,
``initialize``, the checkpoint loaded) and *step* (to the end of the first step).
On loopback a killed node's sockets close at once; where a node vanishes without a word
(power, a cut link), detection is idist's liveness limit instead (``--liveness``, 30 s by default).

Run: .venv/bin/python benchmarks/bench_elastic.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "_elastic_worker.py")
MARK = "failed (exitcode"  # torch's agent: a rank failed (the same line under idist run and torchrun)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Agent:
    """One launcher process; notes when the agent's failure line arrives."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.detected: float | None = None
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if self.detected is None and MARK.encode() in line:
                self.detected = time.time()

    def wait(self) -> int:
        code = self.proc.wait(timeout=300)
        self.reader.join(timeout=10)
        return code


def _env(tmp: str, **extra: str) -> dict[str, str]:
    drop = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(TMPDIR=tmp, PYTHONUNBUFFERED="1", **extra)
    return env


def _split(out: Path, failed: float, detected: float | None) -> dict[str, float]:
    start, ready, step = (float((out / n).read_text()) for n in ("start", "ready", "step"))
    detect = (detected or start) - failed
    return {
        "total": step - failed,
        "detect": detect,
        "restart": start - (detected or start),
        "init": ready - start,
        "step": step - ready,
    }


def crash(launcher: str, tmp: str) -> dict[str, float]:
    out = Path(tempfile.mkdtemp(dir=tmp))
    idist_cmd = [sys.executable, "-m", "idist", "run", "-n", "2", "--max-restarts", "1", "--liveness", "5"]
    raw_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    raw_cmd += ["--max-restarts", "1", "--monitor-interval", "0.1"]
    agent = Agent([*(idist_cmd if launcher == "idist" else raw_cmd), WORKER, str(out), "crash"], _env(tmp))
    assert agent.wait() == 0, launcher
    return _split(out, float((out / "fail").read_text()), agent.detected)


def lost_node(tmp: str) -> dict[str, float]:
    out = Path(tempfile.mkdtemp(dir=tmp))
    port = _free_port()
    cmd = [sys.executable, "-m", "idist", "run", "-n", "2", "--nnodes", "1:2", "--liveness", "5"]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    node0 = Agent([*cmd, "--max-restarts", "1", WORKER, str(out), "stall"], _env(tmp))
    while True:  # node 0 hosts the rendezvous
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    node1 = Agent([*cmd, WORKER, str(out), "stall"], _env(tmp, BENCH_VICTIM="1"))
    while len(stalled := list(out.glob("stalled*"))) < 2 or not all(p.read_text() for p in stalled):
        time.sleep(0.05)
    killed = time.time()
    os.killpg(node1.proc.pid, signal.SIGKILL)
    for p in stalled:
        os.kill(int(p.read_text()), signal.SIGKILL)
    node1.wait()
    assert node0.wait() == 0
    return _split(out, killed, node0.detected)


def _report(name: str, runs: list[dict[str, float]]) -> None:
    parts = ("total", "detect", "restart", "init", "step")
    med = {k: statistics.median(r[k] for r in runs) for k in parts}
    print(f"{name:28s} " + "  ".join(f"{k} {med[k]:5.2f}" for k in parts) + f"   (median of {len(runs)} s)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs: dict[str, list[dict[str, float]]] = {
            "crash, torchrun": [],
            "crash, idist run": [],
            "lost node, idist run": [],
        }
        for _ in range(a.rounds):
            runs["crash, torchrun"].append(crash("torchrun", tmp))
            runs["crash, idist run"].append(crash("idist", tmp))
            runs["lost node, idist run"].append(lost_node(tmp))
        for name, r in runs.items():
            _report(name, r)
        ratio = statistics.median(
            i["total"] / t["total"] for i, t in zip(runs["crash, idist run"], runs["crash, torchrun"], strict=True)
        )
        print(f"crash: idist run / torchrun, median of per-round ratios: {ratio:.2f}")


if __name__ == "__main__":
    main()
