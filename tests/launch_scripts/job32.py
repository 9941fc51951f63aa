"""A job as users run it at 32 ranks on one machine (``idist run -n 32 --checked --liveness 10``):
checked mode, the heartbeat, DDP, a checkpoint saved and loaded. Rank 0 prints one JSON line.

Usage: python job32.py CKPT_DIR
"""

from __future__ import annotations

import json
import sys
import threading

import torch

import idist

with idist.context() as ctx:
    # checked mode: one rank's bad input reaches every rank, and the group stays usable
    try:
        ctx.broadcast(1.0, src=99 if ctx.rank == ctx.world_size - 1 else 0)
        shipped = "no error"
    except idist.CollectiveInputError as exc:
        shipped = str(exc)
    total = ctx.all_reduce(ctx.rank)
    half = ctx.all_reduce(1, group=list(range(0, ctx.world_size, 2))) if ctx.rank % 2 == 0 else None
    watching = sorted({t.name for t in threading.enumerate() if t.name.startswith("idist-liveness")})

    torch.manual_seed(0)
    model = ctx.auto_model(torch.nn.Linear(4, 2))
    opt = ctx.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.full((3, 4), float(ctx.rank))
    model(x).sum().backward()  # DDP averages the gradients of 32 ranks
    opt.step()
    ctx.save_checkpoint(sys.argv[1], {"model": model, "optim": opt, "epoch": 7})
    saved = [p.detach().clone() for p in model.parameters()]

    torch.manual_seed(1)
    fresh = ctx.auto_model(torch.nn.Linear(4, 2))
    fresh_opt = ctx.auto_optim(torch.optim.SGD(fresh.parameters(), lr=0.1))
    values = ctx.load_checkpoint(sys.argv[1], {"model": fresh, "optim": fresh_opt, "epoch": 0})
    same = all(torch.equal(a, b.detach()) for a, b in zip(saved, fresh.parameters(), strict=True))
    agree = ctx.all_gather(int(same and values["epoch"] == 7))
    if ctx.rank == 0:
        report = {"world_size": ctx.world_size, "shipped": shipped, "sum": total, "half": half}
        report |= {"watching": watching, "loaded": agree}
        print("JOB32 " + json.dumps(report), flush=True)
