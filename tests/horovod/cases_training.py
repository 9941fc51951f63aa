"""Rank side of the Horovod training tests: auto_model / auto_optim / auto_dataloader."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import idist
from training_cases import train

CASES = [("sgd", 64), ("adam", 66)]
B, EPOCHS = 8, 3


def two_ranks() -> dict[str, Any]:
    """Every case in one launch; ranks start from different seeds (auto_model must fix that)."""
    ctx = idist.initialize()
    try:
        out: dict[str, Any] = {
            f"{optim}/{n}": train(ctx, n, B, EPOCHS, optim=optim, seed=ctx.rank, flag=True) for optim, n in CASES
        }
        out["bad_op"] = _err(lambda: ctx.auto_optim(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1), op="MAX"))
        out["bad_kw"] = _err(lambda: ctx.auto_optim(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1), nope=1))
        out["different_models"] = _err(lambda: ctx.auto_model(nn.Linear(2, 2 + ctx.rank)))
        out["sync_bn"] = _err(lambda: ctx.auto_model(nn.Linear(2, 2), sync_bn=True))
        # resumed on rank 0 only: the optimizer state comes from rank 0
        torch.manual_seed(ctx.rank)
        model = nn.Linear(3, 1)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        if ctx.rank == 0:  # as if rank 0 loaded a checkpoint of model and optimizer
            model(torch.ones(1, 3)).sum().backward()
            opt.step()
        model = ctx.auto_model(model)
        opt = ctx.auto_optim(opt, op="AVERAGE", backward_passes_per_step=1)
        state = opt.state_dict()["state"]
        out["resumed"] = (len(state), [float(s["step"]) for s in state.values()], state[0]["exp_avg"].tolist())
        out["same_weights_after_resume"] = model.weight.detach().tolist()
        return out
    finally:
        idist.finalize()


def _err(fn: Any) -> str:
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"
