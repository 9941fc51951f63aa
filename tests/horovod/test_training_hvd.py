"""2 Horovod ranks with auto_* at global batch B train like 1 process with batch B."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from cases_training import CASES, EPOCHS, B, train
from hvdrun import hvdrun

import idist


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return hvdrun("cases_training:two_ranks", 2, timeout=300)


@pytest.mark.parametrize(("optim", "n"), CASES)
def test_two_horovod_ranks_train_like_one_process(ranks: list[dict[str, Any]], optim: str, n: int) -> None:
    got = [r[f"{optim}/{n}"] for r in ranks]
    with idist.context("serial") as ctx:
        single = train(ctx, n, B, EPOCHS, optim=optim, seed=0, flag=True)
    for r in got:
        torch.testing.assert_close(torch.tensor(r["weights"]), torch.tensor(single["weights"]), rtol=0, atol=1e-5)
        assert r["flag"] == [True, False]  # rank 0's bool buffer everywhere
        assert r["opt_type"] == single["opt_type"]  # hvd.DistributedOptimizer subclasses the user's optimizer
    assert got[0]["weights"] == got[1]["weights"]
    for e in range(EPOCHS):
        both = got[0]["seen"][e] + got[1]["seen"][e]
        assert len(both) == len(set(both)) == n
        assert sorted(both) == sorted(single["seen"][e])


def test_bad_training_options_raise_on_every_rank(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        assert r["bad_op"].startswith("TrainingSetupError") and "AVERAGE, SUM, ADASUM" in r["bad_op"]
        assert r["bad_kw"].startswith("TrainingSetupError") and "nope" in r["bad_kw"]
        assert (
            r["different_models"].startswith("TrainingSetupError") and "differs between ranks" in r["different_models"]
        )
        assert r["sync_bn"].startswith("TrainingSetupError")


def test_optimizer_state_resumed_on_rank_0_reaches_every_rank(ranks: list[dict[str, Any]]) -> None:
    r0, r1 = ranks
    assert r0["resumed"] == r1["resumed"]
    assert r0["resumed"][0] == 2 and r0["resumed"][1] == [1.0, 1.0]
    assert r0["same_weights_after_resume"] == r1["same_weights_after_resume"]
