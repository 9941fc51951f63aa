"""Rank side of the Horovod training tests: auto_model / auto_optim / auto_dataloader."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

import idist


class Regression(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """A fixed synthetic regression set; each item also carries its index."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 6, generator=g)
        self.y = self.x @ torch.randn(6, 2, generator=g) + 0.1 * torch.randn(n, 2, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[i], self.y[i], i


def make_model() -> nn.Module:
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    model.register_buffer("flag", torch.tensor([True, False]))  # a bool buffer: Horovod cannot broadcast it itself
    return model


def train(ctx: idist.DistContext, optim: str, n: int, global_batch: int, epochs: int, seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = make_model()
    if seed != 0:
        model.get_buffer("flag").copy_(torch.tensor([False, True]))
    model = ctx.auto_model(model)
    params = model.parameters()
    opt = (
        torch.optim.SGD(params, lr=0.05, momentum=0.9) if optim == "sgd" else torch.optim.Adam(params, lr=0.01)
    )  # fmt: skip
    opt = ctx.auto_optim(opt)
    loader = ctx.auto_dataloader(Regression(n), batch_size=global_batch, shuffle=True)
    seen: list[list[int]] = []
    for _ in range(epochs):
        order: list[int] = []
        for x, y, idx in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            order += idx.tolist()
        seen.append(order)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {
        "weights": weights.tolist(),
        "flag": model.get_buffer("flag").tolist(),
        "seen": seen,
        "opt_type": type(opt).__mro__[1].__name__ if ctx.backend == "horovod" else type(opt).__name__,
    }


CASES = [("sgd", 64), ("adam", 66)]
B, EPOCHS = 8, 3


def two_ranks() -> dict[str, Any]:
    """Every case in one launch; ranks start from different seeds (auto_model must fix that)."""
    ctx = idist.initialize()
    try:
        out: dict[str, Any] = {f"{optim}/{n}": train(ctx, optim, n, B, EPOCHS, seed=ctx.rank) for optim, n in CASES}
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
