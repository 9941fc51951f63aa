"""A resumable training run for the elastic tests: DDP (or FSDP), global batches, a checkpoint every 2 steps.

``elastic_train.py OUT [--strategy ddp|fsdp] [--crash-step K --crash-rank R [--crash-always]]
[--stall-step K [--stall-below W]]``: resumes from OUT/ckpt when it exists; on the first attempt
(every one with --crash-always) rank R raises at step K; the ranks launched with IDIST_TEST_VICTIM=1
(or all of them while the world is smaller than W) stall at step K, each writing its pid to
OUT/stalled-rankN, until the test kills them or a node joins; with --hold-below W a run that starts
at step 0 on fewer than W ranks waits at step 1 for the agent to restart it with a joining node. Rank 0 writes the final
parameters to OUT/final.pt, and an empty file per attempt naming its world size and first step.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import idist

N, GLOBAL_BATCH, EPOCHS, SAVE_EVERY = 48, 12, 3, 2


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--crash-step", type=int, default=-1)
    p.add_argument("--crash-rank", type=int, default=0)
    p.add_argument("--crash-always", action="store_true")
    p.add_argument("--stall-step", type=int, default=-1)
    p.add_argument("--stall-below", type=int, default=0)
    p.add_argument("--hold-below", type=int, default=0)
    a = p.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    ctx = idist.initialize()
    try:
        g = torch.Generator().manual_seed(3)
        x = torch.randn(N, 5, generator=g)
        data = TensorDataset(x, x @ torch.randn(5, 1, generator=g))
        torch.manual_seed(0)
        model = ctx.auto_model(nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1)), strategy=a.strategy)
        opt = ctx.auto_optim(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
        loader = ctx.auto_dataloader(data, batch_size=GLOBAL_BATCH, shuffle=True)
        state: dict[str, object] = {"model": model, "optim": opt, "loader": loader, "step": 0}
        try:
            ctx.load_checkpoint(a.out / "ckpt", state)
        except idist.CheckpointNotFoundError:
            pass
        step = int(state["step"])  # type: ignore[call-overload]
        if ctx.rank == 0:
            (a.out / f"attempt{attempt}-world{ctx.world_size}-from{step}").touch()
        while loader.state_dict()["epoch"] < EPOCHS:
            for xb, yb in loader:
                opt.zero_grad()
                nn.functional.mse_loss(model(xb), yb).backward()
                opt.step()
                step += 1
                victim = attempt == 0 and os.environ.get("IDIST_TEST_VICTIM") == "1"
                if step == a.stall_step and (victim or ctx.world_size < a.stall_below):  # before this step's save
                    (a.out / f"stalled-rank{ctx.rank}").write_text(str(os.getpid()))
                    time.sleep(600)  # until the test kills this node, or the agent restarts for a joining one
                if step == 1 and ctx.world_size < a.hold_below:
                    time.sleep(600)  # a fresh start waits at its first step until the agent restarts it for a node
                if step % SAVE_EVERY == 0:
                    state["step"] = step
                    ctx.save_checkpoint(a.out / "ckpt", state)
                if (attempt == 0 or a.crash_always) and step == a.crash_step and ctx.rank == a.crash_rank:
                    raise RuntimeError(f"injected failure at step {step}")
        full = {k: v.detach().clone() for k, v in model.state_dict().items()} if a.strategy == "ddp" else None
        if a.strategy != "ddp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if ctx.rank == 0:
            torch.save({k.removeprefix("module."): v for k, v in (full or {}).items()}, a.out / "final.pt")
    finally:
        idist.finalize()


if __name__ == "__main__":
    main()
