"""Train a model sharded with FSDP, accumulate gradients, checkpoint and resume on any world size.

    .venv/bin/idist run -n 2 examples/train_fsdp.py --checkpoint /tmp/fsdp-ckpt
    .venv/bin/idist run -n 3 examples/train_fsdp.py --checkpoint /tmp/fsdp-ckpt --resume --epochs 6
    .venv/bin/python examples/train_fsdp.py --checkpoint /tmp/fsdp-ckpt --resume --epochs 8   # one process

Shows: ``auto_model(model, strategy="fsdp", shard_modules=(Block,))`` (each ``Block`` and
then the root become FSDP units over the context's process group; each rank keeps about
1/world_size of the parameters and Adam state), ``no_sync`` for gradient accumulation
(``--accumulate K``: one optimizer step per K micro-batches, gradients exchanged once), and
``save_checkpoint`` / ``load_checkpoint``, which do not depend on the world size: a run saved
by 2 ranks resumes on 3, or on one plain process (where the model stays whole).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import idist


class Block(nn.Module):
    """A residual MLP block: the unit FSDP shards and gathers one at a time."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        delta: torch.Tensor = self.ff(self.norm(x))  # a Module's call is untyped in torch
        return x + delta


def make_model(width: int, depth: int) -> nn.Module:
    return nn.Sequential(nn.Linear(16, width), *(Block(width) for _ in range(depth)), nn.Linear(width, 4))


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1536, 16, generator=g)
    y = torch.tanh(x @ torch.randn(16, 4, generator=g))
    return TensorDataset(x, y)


def local_share(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[int, int]:
    """Elements of the parameters and of the optimizer state this rank holds."""
    from torch.distributed.tensor import DTensor

    def local(t: torch.Tensor) -> int:
        return t.to_local().numel() if isinstance(t, DTensor) else t.numel()

    params = sum(local(p) for p in model.parameters())
    state = sum(local(v) for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    return params, state


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=96, help="the global batch of one micro-batch")
    p.add_argument("--accumulate", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--checkpoint", type=Path, default=Path(tempfile.gettempdir()) / "idist-fsdp" / "ckpt")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    args = p.parse_args()

    with idist.context() as ctx:  # gloo under idist run / torchrun, serial under plain python
        if not isinstance(ctx, idist.NativeContext | idist.SerialContext):  # the backends that shard
            raise SystemExit(f"FSDP needs torch.distributed or one process, not {ctx.backend}")
        torch.manual_seed(0)
        model = ctx.auto_model(make_model(args.width, args.depth), strategy="fsdp", shard_modules=(Block,))
        opt = ctx.auto_optim(torch.optim.AdamW(model.parameters(), lr=3e-3))
        state = {"model": model, "optim": opt, "epoch": 0}
        start: int = 0
        if args.resume:
            start = ctx.load_checkpoint(args.checkpoint, state)["epoch"]
        loader = ctx.auto_dataloader(data(), batch_size=args.batch_size, shuffle=True)
        loader.set_epoch(start)
        total = sum(p.numel() for p in model.parameters())
        if ctx.rank == 0:
            print(
                f"{type(ctx).__name__} world_size={ctx.world_size}: {total:,} parameters, "
                f"{type(model).__name__}, epochs {start + 1}..{args.epochs}, accumulate {args.accumulate}"
            )
        for epoch in range(start + 1, args.epochs + 1):
            loss_sum, count = 0.0, 0
            for i, (x, y) in enumerate(loader):
                step_now = (i + 1) % args.accumulate == 0
                with ctx.no_sync(model, enabled=not step_now):  # the gradient exchange waits for the K-th
                    loss = nn.functional.mse_loss(model(x.to(ctx.device)), y.to(ctx.device))
                    (loss / args.accumulate).backward()
                if step_now:
                    opt.step()
                    opt.zero_grad()
                loss_sum, count = loss_sum + loss.item() * len(x), count + len(x)
            mean = ctx.all_reduce(loss_sum) / ctx.all_reduce(count)
            state["epoch"] = epoch
            ctx.save_checkpoint(args.checkpoint, state)
            if ctx.rank == 0:
                print(f"epoch {epoch}: loss {mean:.5f} (checkpoint saved)")
        params, opt_state = local_share(model, opt)
        shares = ctx.all_gather(f"rank {ctx.rank}: {params:,} parameters, {opt_state:,} optimizer elements")
        if ctx.rank == 0:
            print("\n".join(shares))
            print(f"OK: {ctx.world_size} rank(s), checkpoint {args.checkpoint}")


if __name__ == "__main__":
    main()
