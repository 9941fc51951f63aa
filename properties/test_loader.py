"""``auto_dataloader``: N ranks see, step by step, what one process's ``DataLoader`` sees.

For any dataset length, global batch, ``drop_last``, ``shuffle``, seed and 1 or 2 epochs (and a
look at one batch on one rank before training), each rank runs the same number of steps, and
step k's batches of all ranks together hold exactly the samples of batch k of one process's
``DataLoader(batch_size=global)`` over the documented order: ``range(n)``, or with ``shuffle``
``torch.randperm(n)`` from a generator seeded with ``seed + epoch``. Written from
docs/training.md, not from idist's code.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from idist import DistContext
from idist.testing import Runner

# uneven tails and batches that do not divide warn (tests/test_training_*.py check the warnings)
pytestmark = [
    pytest.mark.filterwarnings("ignore:.* is the global batch and does not divide:UserWarning"),
    pytest.mark.filterwarnings("ignore:.* samples in global batches of .* leave a last step:UserWarning"),
]


def one_process(n: int, global_batch: int, drop_last: bool, shuffle: bool, seed: int, epoch: int) -> list[list[int]]:
    """The batches of one process's DataLoader over the documented order of ``epoch``."""
    order = list(range(n))
    if shuffle:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    loader = DataLoader(TensorDataset(torch.arange(n)), batch_size=global_batch, sampler=order, drop_last=drop_last)
    return [b[0].tolist() for b in loader]


def rank_batches(
    ctx: DistContext, n: int, batch: int, drop_last: bool, shuffle: bool, seed: int, epochs: int, peek: int | None
) -> tuple[int | None, list[list[list[int]]]]:
    loader = ctx.auto_dataloader(
        TensorDataset(torch.arange(n)), batch_size=batch, drop_last=drop_last, shuffle=shuffle, seed=seed
    )
    if peek == ctx.rank and len(loader) > 0:
        next(iter(loader))  # a look at one batch, on one rank only
    return loader.global_batch_size, [[b[0].tolist() for b in loader] for _ in range(epochs)]


@given(
    data=st.data(),
    n=st.integers(0, 70),
    batch=st.integers(1, 12),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**16),
    epochs=st.integers(1, 2),
)
def test_each_step_of_the_ranks_is_one_process_batch(
    runner: Runner, data: st.DataObject, n: int, batch: int, drop_last: bool, shuffle: bool, seed: int, epochs: int
) -> None:
    peek = data.draw(st.one_of(st.none(), st.integers(0, runner.world_size - 1)), label="peek")
    results = runner.run(rank_batches, n, batch, drop_last, shuffle, seed, epochs, peek)
    global_batch = results[0][0]
    assert global_batch is not None and global_batch % runner.world_size == 0
    assert global_batch == max(1, batch // runner.world_size) * runner.world_size
    for epoch in range(epochs):
        expected = one_process(n, global_batch, drop_last, shuffle, seed, epoch)
        per_rank = [r[1][epoch] for r in results]
        assert {len(b) for b in per_rank} == {len(expected)}, [len(b) for b in per_rank]  # same steps everywhere
        for step, batch_k in enumerate(expected):
            union = sorted(i for r in per_rank for i in r[step])
            assert union == sorted(batch_k), (epoch, step, per_rank, expected)
