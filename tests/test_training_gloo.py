"""The must-show: 2 gloo processes with auto_* at global batch B train exactly like 1 process
with batch B (weights equal to 1e-5, equal across ranks), every sample once per epoch,
shuffles that change between epochs without set_epoch, and the global RNG untouched."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import idist
from idist import TrainingSetupError
from multiproc import run_ranks
from training_cases import train

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
        out: dict[str, Any] = {(n, drop): train(ctx, n, B, EPOCHS, drop_last=drop) for n, drop in CASES}
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
        single = train(ctx, n, B, EPOCHS, drop_last=drop_last)
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
