"""The must-show: 2 gloo processes with auto_* at global batch B train exactly like 1 process
with batch B (weights equal to 1e-5, equal across ranks), every sample once per epoch,
shuffles that change between epochs without set_epoch, and the global RNG untouched.

Issue 32 on the same processes (one launch, in checked mode): a look at one batch on rank 0
changes nothing; every dataset length 64..71 ends within 1e-6 of one process under DDP and
FSDP, with and without no_sync accumulation; ignite's DeterministicEngine runs 2 ranks like
one process and resumes mid-epoch; a pass one rank takes alone is caught by checked mode."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import idist
from idist import TrainingSetupError
from multiproc import run_ranks
from training_cases import documented_loop, extra_pass_alone, ignite_run, train

CASES = [
    (64, False),  # B divides n
    (70, True),  # a tail of 6 dropped on both sides
    (66, False),  # a tail of 2: one sample per rank, the same mean
]
B, EPOCHS = 8, 3
LENGTHS = range(64, 72)
#: (strategy, accumulate) for the exactness runs; FSDP needs processes, so it is only here
LOOPS = [("ddp", 1), ("ddp", 2), ("fsdp", 1), ("fsdp", 2)]
IGNITE_N, IGNITE_RESUME = 20, 7


def _rank(rank: int) -> dict[str, Any]:
    """Every case in one launch (a process start costs seconds here)."""
    import warnings

    warnings.simplefilter("ignore")  # uneven tails warn at creation; the tests check the warnings in-process
    ctx = idist.initialize("gloo", timeout=60, checked=True)
    try:
        out: dict[str, Any] = {(n, drop): train(ctx, n, B, EPOCHS, drop_last=drop) for n, drop in CASES}
        out["peek"] = train(ctx, 64, B, EPOCHS, peek=True)
        for strategy, k in LOOPS:
            out[strategy, k] = [documented_loop(ctx, n, B, accumulate=k, strategy=strategy) for n in LENGTHS]
        out["ignite"] = ignite_run(ctx, IGNITE_N, 4, 3)
        out["ignite_resumed"] = ignite_run(ctx, IGNITE_N, 4, 3, resume_at=IGNITE_RESUME)
        out["extra_pass"] = extra_pass_alone(ctx)
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


def test_a_look_at_one_batch_on_rank_0_changes_nothing(two_ranks: list[dict[Any, Any]]) -> None:
    with idist.context("serial") as ctx:
        single = train(ctx, 64, B, EPOCHS)
    for r in two_ranks:
        torch.testing.assert_close(
            torch.tensor(r["peek"]["weights"]), torch.tensor(single["weights"]), rtol=0, atol=1e-5
        )
    for e in range(EPOCHS):
        both = two_ranks[0]["peek"]["seen"][e] + two_ranks[1]["peek"]["seen"][e]
        assert sorted(both) == list(range(64))


@pytest.mark.parametrize(("strategy", "accumulate"), LOOPS)
def test_every_dataset_length_ends_within_1e6_of_one_process(
    two_ranks: list[dict[Any, Any]], strategy: str, accumulate: int
) -> None:
    import warnings

    with warnings.catch_warnings(), idist.context("serial") as ctx:
        warnings.simplefilter("ignore")
        single = [documented_loop(ctx, n, B, accumulate=accumulate, strategy=strategy) for n in LENGTHS]
    for i, n in enumerate(LENGTHS):
        for r in two_ranks:
            got = torch.tensor(r[strategy, accumulate][i])
            torch.testing.assert_close(got, torch.tensor(single[i]), rtol=0, atol=1e-6, msg=f"{strategy} n={n}")


def test_ignite_deterministic_engine_two_ranks_like_one_process(two_ranks: list[dict[Any, Any]]) -> None:
    with idist.context("serial") as ctx:
        single = ignite_run(ctx, IGNITE_N, 4, 3)
    r0, r1 = (r["ignite"] for r in two_ranks)
    for r in (r0, r1):
        torch.testing.assert_close(torch.tensor(r["weights"]), torch.tensor(single["weights"]), rtol=0, atol=1e-6)
    assert sorted(r0["seen"] + r1["seen"]) == sorted(single["seen"])
    # resumed at an iteration in the middle of epoch 2: the same batches from there on
    per_rank = IGNITE_RESUME * 2  # samples per rank in the first IGNITE_RESUME steps
    for r in two_ranks:
        assert r["ignite_resumed"]["seen"] == r["ignite"]["seen"][per_rank:]


def test_checked_mode_catches_a_pass_one_rank_takes_alone(two_ranks: list[dict[Any, Any]]) -> None:
    for r in two_ranks:
        assert "epoch" in r["extra_pass"] and "rank 0" in r["extra_pass"], r["extra_pass"]
