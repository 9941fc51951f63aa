"""Multi-GPU training with DDP, with idist; runs as 2 gloo ranks on CPU too.

    .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 examples/multi_gpu_ddp.py

One process per device: nccl when CUDA is visible, gloo on CPU. ``auto_model`` wraps the
model in DistributedDataParallel (``device_ids`` from the context on GPUs), ``sync_bn``
converts BatchNorm on GPUs, and ``auto_dataloader`` gives each rank its share of every
global batch. Rank 0 checks at the end that every rank holds the same weights.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

import idist


def main() -> None:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    with idist.context(backend) as ctx:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1024, 20, generator=g)
        y = (x[:, :5].sum(1) > 0).long()
        dataset = TensorDataset(x, y)

        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(20, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 2))
        model = ctx.auto_model(net, sync_bn=ctx.device.type == "cuda")
        optimizer = ctx.auto_optim(torch.optim.Adam(model.parameters(), lr=1e-2))
        loader = ctx.auto_dataloader(dataset, batch_size=128, shuffle=True, drop_last=True)

        for epoch in range(3):
            correct, seen = 0, 0
            for xb, yb in loader:
                xb, yb = xb.to(ctx.device), yb.to(ctx.device)
                optimizer.zero_grad()
                out = model(xb)
                nn.functional.cross_entropy(out, yb).backward()
                optimizer.step()
                correct += int((out.argmax(1) == yb).sum())
                seen += len(yb)
            acc = ctx.all_reduce(correct) / ctx.all_reduce(seen)
            if ctx.rank == 0:
                print(f"epoch {epoch}: accuracy {acc:.3f} on {ctx.world_size} rank(s) ({ctx.backend}, {ctx.device})")

        weights = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
        gathered = ctx.all_gather(weights)
        if ctx.rank == 0:
            same = all(torch.equal(gathered[0], w) for w in gathered)
            print(f"weights identical on all ranks: {same}")
            if not same:
                raise SystemExit("ranks diverged")


if __name__ == "__main__":
    main()
