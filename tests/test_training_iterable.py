"""auto_dataloader on an IterableDataset (issue 32): every item once across ranks and workers.

With ``shard_iterable=True`` a dataset that splits itself by ``get_worker_info()`` (the pattern
in torch's docs) and a naive one both give each item to exactly one (rank, worker); not
sharding warns; a dataset with ``__len__`` gives the loader a length and warns when ranks would
run different numbers of batches.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator

import pytest
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import idist
from idist.training import ShardedIterableDataset
from test_training_loader import on_ranks


class Naive(IterableDataset[int]):
    """Yields every item wherever it runs."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


class NaiveSized(Naive):
    def __len__(self) -> int:
        return self.n


class WorkerAware(IterableDataset[int]):
    """torch's documented pattern: each worker takes its own contiguous range."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        if info is None:
            return iter(range(self.n))
        per_worker = math.ceil(self.n / info.num_workers)
        start = info.id * per_worker
        return iter(range(start, min(start + per_worker, self.n)))


def items(loader: DataLoader[int]) -> list[int]:
    return [int(i) for batch in loader for i in batch]


@pytest.mark.parametrize("kind", [Naive, WorkerAware])
@pytest.mark.parametrize("workers", [0, 2])
def test_each_item_once_across_ranks_and_workers(kind: type[IterableDataset[int]], workers: int) -> None:
    n, world = 12, 2
    seen = []
    for rank in range(world):
        shard = ShardedIterableDataset(kind(n), rank, world)  # type: ignore[call-arg]
        seen.append(items(DataLoader(shard, batch_size=2, num_workers=workers)))
    union = seen[0] + seen[1]
    assert sorted(union) == list(range(n)), seen


@pytest.mark.parametrize("kind", [Naive, WorkerAware])
def test_one_process_with_workers_loads_each_item_once(kind: type[IterableDataset[int]]) -> None:
    loader = idist.auto_dataloader(kind(12), batch_size=2, shard_iterable=True, num_workers=2)  # type: ignore[call-arg]
    assert sorted(items(loader)) == list(range(12))


def test_not_sharding_warns_once_and_explicit_false_does_not() -> None:
    def run(ctx: idist.DistContext) -> list[int]:
        ctx.auto_dataloader(Naive(6), batch_size=2)
        ctx.auto_dataloader(Naive(6), batch_size=2, shard_iterable=False)  # the dataset splits itself
        return items(ctx.auto_dataloader(Naive(6), batch_size=2))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert on_ranks(2, run) == [list(range(6))] * 2
    messages = [str(w.message) for w in caught if "not sharded" in str(w.message)]
    assert len(messages) == 4 and all("shard_iterable=True" in m for m in messages), messages
    assert all(w.filename == __file__ for w in caught if "not sharded" in str(w.message))


def test_a_sharded_iterable_with_len_has_a_length_and_warns_when_uneven() -> None:
    def run(ctx: idist.DistContext) -> tuple[int, int, int, int]:
        uneven = ctx.auto_dataloader(NaiveSized(9), batch_size=4, shard_iterable=True)
        even = ctx.auto_dataloader(NaiveSized(9), batch_size=4, shard_iterable=True, drop_last=True)
        return len(uneven), len(items(uneven)), len(even), len(list(even))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (l0, n0, e0, b0), (l1, n1, e1, b1) = on_ranks(2, run)
    assert (l0, l1) == (3, 2) and (n0, n1) == (5, 4)  # len() is this rank's batch count
    assert e0 == e1 == b0 == b1 == 2  # drop_last: every rank gets as many items
    messages = [str(w.message) for w in caught if "batches per epoch" in str(w.message)]
    assert len(messages) == 2 and all("drop_last=True" in m for m in messages), [str(w.message) for w in caught]
