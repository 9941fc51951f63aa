"""One training run that every backend's equivalence test shares (imported by the ranks).

``train(ctx, n, global_batch, epochs)`` trains a small regression model with auto_model,
auto_optim and auto_dataloader and returns its final weights (plain floats), the sample
indices each epoch saw, and whether the global RNG was left alone. Run on N ranks at
global batch B, the weights must equal a single process's at batch B.
"""

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


def make_model(flag: bool = False) -> nn.Module:
    """A 6 -> 16 -> 2 MLP; ``flag`` adds a bool buffer (which Horovod cannot broadcast itself)."""
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    if flag:
        model.register_buffer("flag", torch.tensor([True, False]))
    return model


def train(
    ctx: idist.DistContext, n: int, global_batch: int, epochs: int, *,
    drop_last: bool = False, optim: str = "sgd", seed: int = 0, flag: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Train from ``seed``'s initial weights (auto_model must give every rank rank 0's)."""
    torch.manual_seed(seed)
    model = make_model(flag)
    if flag and seed != 0:
        model.get_buffer("flag").copy_(torch.tensor([False, True]))
    model = ctx.auto_model(model)
    rng_after_init = torch.get_rng_state()
    params = model.parameters()
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9) if optim == "sgd" else torch.optim.Adam(params, lr=0.01)
    opt = ctx.auto_optim(opt)
    loader = ctx.auto_dataloader(Regression(n), batch_size=global_batch, shuffle=True, drop_last=drop_last)
    seen: list[list[int]] = []
    for _ in range(epochs):  # no set_epoch anywhere
        order: list[int] = []
        for x, y, idx in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            order += idx.tolist()
        seen.append(order)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    # plain values: tensors through a multiprocessing queue need the sender alive
    return {
        "weights": weights.tolist(),
        "seen": seen,
        "rng_untouched": torch.equal(torch.get_rng_state(), rng_after_init),
        "flag": model.get_buffer("flag").tolist() if flag else None,
        "opt_type": type(opt).__mro__[1].__name__ if ctx.backend == "horovod" else type(opt).__name__,
    }
