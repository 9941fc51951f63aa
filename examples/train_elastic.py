"""Elastic training: a crashed rank or a lost node costs one restart, and the model ends the same.

Run on one node, with one injected failure to watch a restart (2 CPU processes, gloo):

    idist run -n 2 --max-restarts 1 examples/train_elastic.py --checkpoint /tmp/elastic/ckpt --fail-at 7

or on two machines that may shrink to one (the same command on both; the node that owns
10.0.0.1 hosts the rendezvous):

    idist run -n 2 --nnodes 1:2 --max-restarts 3 --master-addr 10.0.0.1 --master-port 29500 \\
        examples/train_elastic.py --checkpoint /shared/elastic/ckpt

The loop is the usual one plus two calls: ``load_checkpoint`` at the start (nothing there on the
first attempt) and ``save_checkpoint`` every few steps. The loader is in the checkpoint's
state: it saves its position (epoch, global samples), so a restart on any number of ranks
continues with the very next global batch. The global batch (24) divides by every world size
the job may run at (1, 2, 3, 4, 6 ranks), so the run ends with the parameters of an
uninterrupted one (docs/elastic.md says when this cannot hold).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import idist


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, required=True, help="a folder every node sees (shared storage)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--save-every", type=int, default=5, help="steps between two checkpoints")
    p.add_argument("--fail-at", type=int, default=None, help="raise once at this step on the last rank (a demo)")
    a = p.parse_args()

    ctx = idist.initialize()  # gloo under idist run / torchrun, serial under plain python
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(480, 10, generator=g)
        data = TensorDataset(x, x @ torch.randn(10, 1, generator=g) + 0.1 * torch.randn(480, 1, generator=g))
        torch.manual_seed(0)  # every attempt starts from the same weights (auto_model gives all ranks rank 0's)
        model = ctx.auto_model(nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1)))
        optimizer = ctx.auto_optim(torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9))
        loader = ctx.auto_dataloader(data, batch_size=24, shuffle=True)  # 24: the global batch
        state: dict[str, object] = {"model": model, "optimizer": optimizer, "loader": loader, "step": 0}
        try:
            ctx.load_checkpoint(a.checkpoint, state)  # model, optimizer and the loader's position
        except idist.CheckpointNotFoundError:
            pass  # the first attempt
        step = int(state["step"])  # type: ignore[call-overload]
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        if ctx.rank == 0:
            print(f"attempt {restart}: {ctx.world_size} ranks, from step {step}, loader at {loader.state_dict()}")
        while loader.state_dict()["epoch"] < a.epochs:
            total, steps = torch.zeros(()), 0
            for xb, yb in loader:
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(xb), yb)
                loss.backward()
                optimizer.step()
                total += loss.detach()
                step, steps = step + 1, steps + 1
                if step % a.save_every == 0:
                    state["step"] = step
                    ctx.save_checkpoint(a.checkpoint, state)  # published whole, or not at all
                if step == a.fail_at and restart == "0" and ctx.rank == ctx.world_size - 1:
                    raise RuntimeError(f"a failure injected at step {step} (--fail-at)")
            mean = ctx.all_reduce(total.item()) / ctx.world_size / max(steps, 1)  # this attempt's steps
            if ctx.rank == 0:
                print(f"epoch {loader.epoch}: step {step}, mean loss {mean:.4f}")
        weights = torch.cat([p.detach().flatten() for p in model.parameters()])
        if ctx.rank == 0:
            print(f"done at step {step}: weights sum {weights.sum().item():.6f}")
    finally:
        idist.finalize()


if __name__ == "__main__":
    main()
