"""The must-show: 2 gloo processes with auto_* at global batch B train exactly like 1 process
with batch B (weights equal to 1e-5, equal across ranks), every sample once per epoch,
shuffles that change between epochs without set_epoch, and the global RNG untouched."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

import idist
from idist import TrainingSetupError
from multiproc import run_ranks


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


def train(ctx: idist.DistContext, n: int, drop_last: bool, global_batch: int, epochs: int) -> dict[str, Any]:
    torch.manual_seed(0)  # the same initial weights everywhere
    model = ctx.auto_model(nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2)))
    rng_after_init = torch.get_rng_state()
    opt = ctx.auto_optim(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
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
    # plain floats: tensors through a multiprocessing queue need the sender alive
    return {
        "weights": weights.tolist(),
        "seen": seen,
        "rng_untouched": torch.equal(torch.get_rng_state(), rng_after_init),
    }


CASES = [
    (64, False),  # B divides n
    (70, True),  # a tail of 6 dropped on both sides
    (66, False),  # a tail of 2: one sample per rank, the same mean
]
B, EPOCHS = 8, 3


def _rank(rank: int) -> dict[str, Any]:
    """Every case in one launch (a process start costs seconds here)."""
    ctx = idist.initialize("gloo", timeout=60)
    try:
        out: dict[str, Any] = {case: train(ctx, *case, B, EPOCHS) for case in CASES}
        try:
            ctx.auto_model(nn.Linear(2, 2), device_ids=[rank])
            out["device_ids"] = "no error"
        except TrainingSetupError as exc:
            out["device_ids"] = str(exc)
        return out
    finally:
        idist.finalize()


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[Any, Any]]:
    return run_ranks(_rank, 2, timeout=180)


@pytest.mark.parametrize(("n", "drop_last"), CASES)
def test_two_ranks_at_global_batch_train_like_one_process(
    two_ranks: list[dict[Any, Any]], n: int, drop_last: bool
) -> None:
    ranks = [r[(n, drop_last)] for r in two_ranks]
    with idist.context("serial") as ctx:
        single = train(ctx, n, drop_last, B, EPOCHS)
    for r in ranks:
        torch.testing.assert_close(torch.tensor(r["weights"]), torch.tensor(single["weights"]), rtol=0, atol=1e-5)
        assert r["rng_untouched"]
    assert ranks[0]["weights"] == ranks[1]["weights"]
    assert single["rng_untouched"]
    kept = n - n % B if drop_last else n
    for e in range(EPOCHS):
        both = ranks[0]["seen"][e] + ranks[1]["seen"][e]
        assert len(both) == len(set(both)) == kept  # each sample exactly once
        assert sorted(both) == sorted(single["seen"][e])  # the same samples as one process
    assert ranks[0]["seen"][0] != ranks[0]["seen"][1] != ranks[0]["seen"][2]


def test_device_ids_raise_on_every_rank(two_ranks: list[dict[Any, Any]]) -> None:
    for r in two_ranks:
        assert "auto_model sets device_ids itself" in r["device_ids"]
