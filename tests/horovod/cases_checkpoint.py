"""Rank side of the Horovod checkpoint tests: a replicated model is saved once (by rank 0)
and loads on any world size; FSDP and no_sync say what to use on Horovod instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from cases_training import _err
from torch import nn

import idist


def make(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def snapshot(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, list[float]]:
    out = {f"model.{k}": v.flatten().tolist() for k, v in model.state_dict().items()}
    for i, entry in opt.state_dict()["state"].items():
        out.update({f"optim.{i}.{k}": torch.as_tensor(v).flatten().tolist() for k, v in entry.items()})
    return out


def save(folder: str) -> dict[str, Any]:
    """Train replicated on every rank (rank 0's weights, averaged gradients), then save."""
    ctx = idist.initialize()
    try:
        model, opt = make(seed=ctx.rank)
        model = ctx.auto_model(model)
        opt = ctx.auto_optim(opt)
        g = torch.Generator().manual_seed(ctx.rank)
        for _ in range(3):
            opt.zero_grad()
            nn.functional.mse_loss(model(torch.randn(8, 6, generator=g)), torch.zeros(8, 2)).backward()
            opt.step()
        ctx.save_checkpoint(Path(folder) / "hvd", {"model": model, "optim": opt, "epoch": 3})
        return {
            "state": snapshot(model, opt),
            "files": sorted(p.name for p in (Path(folder) / "hvd").iterdir()),
            "fsdp": _err(lambda: idist.auto_model(nn.Linear(2, 2), strategy="fsdp")),
            "no_sync": _err(lambda: idist.no_sync(model).__enter__()),
        }
    finally:
        idist.finalize()


def load(folder: str) -> dict[str, Any]:
    """Load into a fresh model and hvd.DistributedOptimizer on this world size."""
    ctx = idist.initialize()
    try:
        model, opt = make(seed=10 + ctx.rank)
        model = ctx.auto_model(model)
        opt = ctx.auto_optim(opt)
        values = ctx.load_checkpoint(Path(folder) / "hvd", {"model": model, "optim": opt})
        missing = _err(lambda: ctx.load_checkpoint(Path(folder) / "nothing", {"model": model}))
        return {"state": snapshot(model, opt), "epoch": values["epoch"], "world": ctx.world_size, "missing": missing}
    finally:
        idist.finalize()
