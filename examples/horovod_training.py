"""Horovod training on CPU with idist: the same script as on gloo, with ``backend="horovod"``.

    idist run --backend horovod -n 2 examples/horovod_training.py     # 2 Horovod ranks
    horovodrun -np 2 -H localhost:2 --gloo python examples/horovod_training.py
    python examples/horovod_training.py                                 # one process

``Parallel`` initializes Horovod (horovodrun's environment), ``auto_model`` starts every
rank from rank 0's weights, ``auto_optim`` wraps the optimizer in
``hvd.DistributedOptimizer`` (gradients averaged in ``step()``), ``auto_dataloader`` gives
each rank its share of every global batch. Losses and accuracies are reduced exactly
across ranks. At the end every rank checks that all ranks hold the same weights (and
exits non-zero if not).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

import idist


def blobs(n: int, classes: int = 4, seed: int = 0) -> TensorDataset:
    """``n`` points around ``classes`` centres in 8 dimensions (no download)."""
    g = torch.Generator().manual_seed(seed)
    centres = 3 * torch.randn(classes, 8, generator=g)
    labels = torch.randint(0, classes, (n,), generator=g)
    points = centres[labels] + torch.randn(n, 8, generator=g)
    return TensorDataset(points, labels)


def training(local_rank: int, config: dict[str, Any]) -> dict[str, float]:
    ctx = idist.current()
    if ctx.rank == 0:
        ctx.show_config()
        print(f"{type(ctx).__name__}: {ctx.world_size} rank(s), backend {ctx.backend}", flush=True)
    torch.manual_seed(ctx.rank)  # different on purpose: auto_model starts everyone from rank 0
    model = ctx.auto_model(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)))
    optimizer = ctx.auto_optim(torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9))
    loader = ctx.auto_dataloader(blobs(config["samples"]), batch_size=config["batch_size"], shuffle=True)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    history: list[float] = []
    for epoch in range(1, config["epochs"] + 1):
        total, correct, seen = 0.0, 0, 0
        for x, y in loader:
            optimizer.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            (loss / len(y)).backward()
            optimizer.step()
            total += loss.item()
            correct += int((out.argmax(1) == y).sum())
            seen += len(y)
        # exact sums over ranks: Python numbers travel as float64 / int64
        total, correct, seen = ctx.all_reduce(total), ctx.all_reduce(correct), ctx.all_reduce(seen)
        history.append(total / seen)
        if ctx.rank == 0:
            print(
                f"epoch {epoch}: loss {total / seen:.4f}  accuracy {correct / seen:.3f}  ({seen} samples)", flush=True
            )
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    same = all(torch.equal(w, weights) for w in ctx.all_gather(weights))
    if not same or not history[-1] < history[0] or not math.isfinite(history[-1]):
        raise SystemExit(f"rank {ctx.rank}: training check failed (same weights: {same}, losses {history})")
    if ctx.rank == 0:
        print(f"OK: {ctx.world_size} rank(s) hold the same weights; loss {history[0]:.4f} -> {history[-1]:.4f}")
    return {"first": history[0], "last": history[-1]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="the global batch, split over the ranks")
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--lr", type=float, default=0.05)
    config = vars(p.parse_args())
    # In place under a launcher (horovodrun): Horovod is initialized on entry, finalized on exit.
    with idist.Parallel(backend="horovod") as parallel:
        parallel.run(training, config)


if __name__ == "__main__":
    main()
