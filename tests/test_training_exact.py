"""N ranks train exactly like one process on every dataset length (issue 32, item 2).

The documented loop (a mean loss, auto_model, auto_optim, auto_dataloader; with and without
no_sync accumulation) on 2 in-process gloo ranks with DDP ends within 1e-6 of one process for
every length from 64 to 71 at global batch 8: the last step's samples split unevenly (3 as
2 and 1), or leave a rank an empty batch (1 sample). The same on real processes, and FSDP,
is in test_training_gloo.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import idist
from test_training_loader import on_ranks
from training_cases import documented_loop

B = 8


@pytest.mark.parametrize("accumulate", [1, 2])
def test_two_ranks_end_like_one_process_on_every_length(accumulate: int) -> None:
    lengths = range(64, 72)

    def run(ctx: idist.DistContext) -> list[list[float]]:
        return [documented_loop(ctx, n, B, accumulate=accumulate) for n in lengths]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the uneven tails warn at creation
        ranks = on_ranks(2, run, timeout=120)
        with idist.context("serial") as ctx:
            single = run(ctx)
    for i, n in enumerate(lengths):
        for r in ranks:
            torch.testing.assert_close(torch.tensor(r[i]), torch.tensor(single[i]), rtol=0, atol=1e-6, msg=f"n={n}")


def test_a_repeated_sample_carries_no_weight() -> None:
    """even_batches=True repeats a sample on the ranks the last step leaves without one."""

    def run(ctx: idist.DistContext) -> list[float]:
        return documented_loop(ctx, 65, B, even_batches=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ranks = on_ranks(2, run, timeout=120)
        with idist.context("serial") as ctx:
            single = run(ctx)
    for r in ranks:
        torch.testing.assert_close(torch.tensor(r), torch.tensor(single), rtol=0, atol=1e-6)
