"""The training examples run: 1 process, and 2 gloo ranks under torchrun.

The digits example also proves resume: 3 epochs straight as one process, and 2 epochs on 2
ranks plus a third resumed on 3, end with the same weights (global batches make N ranks train
like one process; the loader's epoch is restored with the checkpoint, which does not depend on
the world size that wrote it).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
import torch

import idist
from launch_util import run_session

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def run(args: list[str], timeout: float = 240) -> str:
    """Run to completion; on a timeout kill the whole process group (torchrun and its ranks)."""
    proc, timed_out = run_session(args, timeout, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert not timed_out, f"{args} timed out after {timeout}s:\n{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.timeout(300)
def test_basic_setup_runs_as_one_process() -> None:
    out = run([sys.executable, str(EXAMPLES / "basic_setup.py")])
    losses = [float(line.split("loss ")[1].split()[0]) for line in out.splitlines() if line.startswith("epoch")]
    assert len(losses) == 3 and losses[-1] < losses[0] / 10
    assert "(1 process(es), None)" in out


@pytest.mark.timeout(300)
def test_multi_gpu_ddp_example_on_two_gloo_ranks() -> None:
    out = run([*TORCHRUN, str(EXAMPLES / "multi_gpu_ddp.py")])
    assert "on 2 rank(s) (gloo, cpu)" in out
    assert "weights identical on all ranks: True" in out


@pytest.mark.timeout(300)
def test_ignite_trainer_example_on_two_gloo_ranks() -> None:
    out = run([*TORCHRUN, str(EXAMPLES / "ignite_trainer.py"), "--min-accuracy", "0.8"])
    assert out.count("val accuracy") == 3  # printed by rank 0 only


def _digits_weights(folder: Path) -> tuple[int, dict[str, torch.Tensor]]:
    """The epoch and weights of a train_digits checkpoint, loaded into one plain process."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    with idist.context("serial") as ctx:
        values = ctx.load_checkpoint(folder, {"model": model})
    return values["epoch"], model.state_dict()


@pytest.mark.timeout(600)
def test_train_digits_trains_checkpoints_and_resumes_on_another_world_size(tmp_path: Path) -> None:
    """3 epochs as one process (in a pipe: one line per epoch, no bar), and 2 epochs on 2 ranks plus a
    third resumed on 3 (on a terminal: rank 0's bars, redrawn in place) end with the same weights."""
    script = str(EXAMPLES / "train_digits.py")
    straight, split = tmp_path / "straight", tmp_path / "split"
    metrics = tmp_path / "metrics.json"
    args = [sys.executable, script, "--epochs", "3", "--checkpoint", str(straight), "--metrics-out", str(metrics)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    piped = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=True)
    epochs = [line.split(":")[0] for line in piped.stdout.splitlines() if line.startswith("epoch")]
    assert epochs == ["epoch 1", "epoch 2", "epoch 3"], piped.stdout
    assert "train:" not in piped.stderr and "\r" not in piped.stderr + piped.stdout, piped.stderr
    history = json.loads(metrics.read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert history[-1]["train_loss"] < history[0]["train_loss"] and history[-1]["test_acc"] > 0.85
    out = run([*TORCHRUN, script, "--epochs", "2", "--checkpoint", str(split)])
    assert "NativeContext world_size=2: global batch 96 (48 per rank)" in out
    assert _digits_weights(split)[0] == 2
    three = [*TORCHRUN[:-1], "3"]
    resumed = run_on_terminal([*three, script, "--epochs", "3", "--checkpoint", str(split), "--resume"], timeout=240)
    assert "NativeContext world_size=3: global batch 96 (32 per rank), epochs 3..3" in resumed
    assert "epoch 1:" not in resumed and "epoch 3:" in resumed
    assert "\rtrain:" in resumed and "\reval:" in resumed
    (ea, a), (eb, b) = _digits_weights(straight), _digits_weights(split)
    assert ea == eb == 3
    for name, tensor in a.items():  # 1 process, and 2 ranks then 3: the same weights
        torch.testing.assert_close(b[name], tensor, rtol=0, atol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "split", "straight"]  # no staging left


def run_on_terminal(args: list[str], timeout: float = 120) -> str:
    """Run with stdout and stderr on a 24x100 pseudo-terminal; returns what it showed."""
    main, sub = pty.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 0 columns: tqdm draws nothing
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=sub, stderr=sub, start_new_session=True)
    os.close(sub)
    chunks = []
    try:
        while True:
            try:
                data = os.read(main, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=timeout)
    finally:
        os.close(main)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, f"{args} failed ({proc.returncode}):\n{out}"
    return out


@pytest.mark.timeout(600)
def test_train_fsdp_shards_under_idist_run_and_resumes_on_three_ranks(tmp_path: Path) -> None:
    idist_run = [sys.executable, "-m", "idist", "run"]
    common = [str(EXAMPLES / "train_fsdp.py"), "--checkpoint", str(tmp_path / "ck")]
    out = run([*idist_run, "-n", "2", *common, "--epochs", "2"])
    assert "[rank0]:NativeContext world_size=2: 134,212 parameters, FSDPSequential, epochs 1..2" in out
    assert "[rank0]:rank 0: 67,106 parameters" in out and "[rank0]:rank 1: 67,106 parameters" in out
    assert "[rank0]:OK: 2 rank(s)" in out
    out = run([*idist_run, "-n", "3", *common, "--epochs", "3", "--resume"])
    assert "epochs 3..3" in out and "[rank0]:OK: 3 rank(s)" in out
    values = idist.load_checkpoint(tmp_path / "ck", {})  # the plain values alone
    assert values["epoch"] == 3
