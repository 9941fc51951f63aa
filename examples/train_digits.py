"""Train a small classifier on scikit-learn's bundled digits with idist (no download).

Run on 2 CPU processes (gloo), the same script runs serially with plain ``python``:

    .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        examples/train_digits.py --epochs 3 --checkpoint /tmp/digits/ckpt
    # later: continue to epoch 6 from the checkpoint, on 3 processes (or 1: plain python)
    ... --nproc_per_node 3 examples/train_digits.py --epochs 6 --checkpoint /tmp/digits/ckpt --resume

Shows: ``auto_model`` / ``auto_optim`` / ``auto_dataloader`` (``--batch-size`` is the
global batch), progress bars on rank 0 when its output is a terminal (in a log file or CI:
one line per epoch, ``--progress`` overrides), per-epoch loss and accuracy reduced across
ranks exactly, ``save_checkpoint`` after every epoch (every rank writes its part; the
folder is replaced atomically), and resuming from it with ``load_checkpoint`` on any number
of processes (the loader's epoch is restored, so a resumed run sees the same shuffles as
an uninterrupted one and ends with the same weights).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset
from tqdm import tqdm

import idist


def digits() -> tuple[TensorDataset, TensorDataset]:
    """1797 8x8 images, split 1500 / 297 by a fixed permutation."""
    x, y = load_digits(return_X_y=True)
    images = torch.tensor(x, dtype=torch.float32) / 16.0
    labels = torch.tensor(y, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    train, test = order[:1500], order[1500:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[test], labels[test])


def show_bars(choice: str) -> bool:
    """Bars redraw a terminal line in place; written to a file or a pipe, every redraw would
    be a line of its own, so there the per-epoch lines are the only progress shown."""
    return choice == "bar" or (choice == "auto" and sys.stderr.isatty())


def run_epoch(
    ctx: idist.DistContext, model: nn.Module, loader: Any, opt: torch.optim.Optimizer | None, bars: bool
) -> tuple[float, float]:
    """One pass; returns (mean loss, accuracy) over every rank's samples (exact sums)."""
    model.train(opt is not None)
    loss_sum, correct, count = 0.0, 0, 0
    bar = tqdm(loader, disable=ctx.rank != 0 or not bars, leave=False, desc="train" if opt else "eval")
    with torch.set_grad_enabled(opt is not None):
        for x, y in bar:
            x, y = x.to(ctx.device), y.to(ctx.device)
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
            if opt is not None:
                opt.zero_grad()
                loss.backward()
                opt.step()
            loss_sum += loss.item() * len(y)
            correct += int((out.argmax(1) == y).sum())
            count += len(y)
            bar.set_postfix(loss=f"{loss.item():.3f}")
    loss_sum, correct, count = ctx.all_reduce(loss_sum), ctx.all_reduce(correct), ctx.all_reduce(count)
    return loss_sum / count, correct / count


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=96, help="the global batch (all ranks together)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--checkpoint", type=Path, default=Path(tempfile.gettempdir()) / "idist-digits" / "ckpt")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--metrics-out", type=Path, help="rank 0 writes the per-epoch metrics here (JSON)")
    p.add_argument(
        "--progress", choices=("auto", "bar", "epoch"), default="auto",
        help="progress bars (bar) or one line per epoch (epoch); auto: bars when stderr is a terminal",
    )  # fmt: skip
    args = p.parse_args()

    bars = show_bars(args.progress)
    ctx = idist.initialize()  # gloo under torchrun / idist run, serial under plain python
    try:
        train_set, test_set = digits()
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        model = ctx.auto_model(net)  # net itself, or the DDP wrapping it: train through model
        opt = ctx.auto_optim(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9))
        state = {"model": model, "optimizer": opt, "epoch": 0}
        start: int = 0
        if args.resume:  # whatever number of processes saved it
            start = ctx.load_checkpoint(args.checkpoint, state)["epoch"]
        train_loader = ctx.auto_dataloader(train_set, batch_size=args.batch_size, shuffle=True)
        test_loader = ctx.auto_dataloader(test_set, batch_size=300)
        train_loader.set_epoch(start)  # a resumed run continues the same sequence of shuffles
        if ctx.rank == 0:
            print(
                f"{type(ctx).__name__} world_size={ctx.world_size}: global batch {train_loader.global_batch_size} "
                f"({train_loader.batch_size} per rank), epochs {start + 1}..{args.epochs}"
            )
        history = []
        for epoch in range(start + 1, args.epochs + 1):
            train_loss, train_acc = run_epoch(ctx, model, train_loader, opt, bars)
            test_loss, test_acc = run_epoch(ctx, model, test_loader, None, bars)
            history.append({"epoch": epoch, "train_loss": train_loss, "train_acc": train_acc, "test_acc": test_acc})
            if ctx.rank == 0:
                print(
                    f"epoch {epoch}: train loss {train_loss:.4f} acc {train_acc:.3f} | "
                    f"test loss {test_loss:.4f} acc {test_acc:.3f}"
                )
            state["epoch"] = epoch
            ctx.save_checkpoint(args.checkpoint, state)  # every rank; returns once it is published
        if ctx.rank == 0:
            print(f"checkpoint: {args.checkpoint}")
            if args.metrics_out is not None:
                args.metrics_out.write_text(json.dumps(history))
    finally:
        idist.finalize()


if __name__ == "__main__":
    main()
