"""``shard_iterable=True``: each item of an ``IterableDataset`` goes to one (rank, worker) pair.

Item p goes to rank ``p % W``, and within that rank's items to worker ``(p // W) % K`` (K
workers per rank), so shard ``s = r + W * w`` of ``W * K`` takes positions ``s, s + WK, ...``.
A dataset that splits itself by ``get_worker_info()`` (torch's documented pattern) is told
that it runs as worker ``s`` of ``W * K`` while idist calls it; one that never reads
``id`` / ``num_workers`` is sliced instead. Either way every item is loaded exactly once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sized
from itertools import chain, islice
from typing import TypeVar, final

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info
from torch.utils.data._utils import worker as _worker

from ._options import DataLoaderOptions
from ._sampler import rank_count
from ._warn import warn

T = TypeVar("T")
R = TypeVar("R")

#: ``get_worker_info()`` reads one module global; simulated ranks (threads) take turns setting it
_INFO_LOCK = threading.Lock()


class _Probe(_worker.WorkerInfo):
    """The worker info a sharded dataset sees: its shard among all (rank, worker) pairs."""

    def __init__(self, shard: int, shards: int, real: _worker.WorkerInfo | None, dataset: Dataset[object]) -> None:
        seed = real.seed if real is not None else torch.initial_seed()
        extra = {k: getattr(real, k) for k in ("rng", "worker_method") if hasattr(real, k)}  # newer torch
        super().__init__(id=shard, num_workers=shards, seed=seed, dataset=real.dataset if real else dataset, **extra)
        object.__setattr__(self, "asked", [])

    def __getattribute__(self, name: str) -> object:
        if name in ("id", "num_workers"):
            object.__getattribute__(self, "asked").append(name)
        return object.__getattribute__(self, name)

    def call(self, fn: Callable[..., R], *args: object) -> R:
        """``fn(*args)`` while ``get_worker_info()`` answers with this probe."""
        with _INFO_LOCK:
            saved, _worker._worker_info = _worker._worker_info, self
            try:
                return fn(*args)
            finally:
                _worker._worker_info = saved


@final
class ShardedIterableDataset(IterableDataset[T]):
    """Each item of ``dataset`` goes to one (rank, worker) pair; ``len()`` is this rank's share.

    With ``drop_last`` and a dataset that has a length, only the first ``len - len % world_size``
    items are used, so every rank gets as many.
    """

    def __init__(self, dataset: IterableDataset[T], rank: int, world_size: int, drop_last: bool = False) -> None:
        self.dataset = dataset
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last

    def _used(self) -> int | None:
        if not isinstance(self.dataset, Sized):
            return None
        n = len(self.dataset)
        return n - n % self.world_size if self.drop_last else n

    def __len__(self) -> int:
        used = self._used()
        if used is None:
            raise TypeError(f"{type(self.dataset).__name__} has no len()")
        return rank_count(used, self.world_size, self.rank)

    def __iter__(self) -> Iterator[T]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        shard, shards = self.rank + self.world_size * worker, self.world_size * workers
        probe = _Probe(shard, shards, info, self.dataset)
        it = probe.call(iter, self.dataset)
        first = probe.call(next, it, _END)
        if first is _END:
            return
        if probe.asked:  # the dataset split itself by the probe
            yield first
            while (item := probe.call(next, it, _END)) is not _END:
                yield item
            return
        yield from islice(chain([first], it), shard, self._used(), shards)

    def batches(self, per_rank: int, drop_last: bool, workers: int) -> int:
        """The batches this rank loads per epoch (each worker batches its own items)."""
        mine = len(self)
        counts = [rank_count(mine, max(workers, 1), w) for w in range(max(workers, 1))]
        return sum(c // per_rank if drop_last else -(-c // per_rank) for c in counts)


_END: object = object()


def shard_or_warn(
    dataset: IterableDataset[T], rank: int, world: int, shard: object, kw: DataLoaderOptions, b: int | None
) -> IterableDataset[T]:
    """``dataset`` sharded (``shard_iterable=True``) or as it is; warn where ranks would differ."""
    workers, drop_last = kw.get("num_workers", 0), bool(kw.get("drop_last", False))
    if shard:
        if isinstance(dataset, Sized) and b is not None and world > 1:
            counts = {
                ShardedIterableDataset(dataset, r, world, drop_last).batches(b, drop_last, workers)
                for r in range(world)
            }
            if len(counts) > 1:
                warn(
                    f"{len(dataset)} items over {world} ranks in batches of {b}: some ranks run {max(counts)} batches "
                    f"per epoch, others {min(counts)}, and DDP training blocks on the extra step. Pass drop_last=True "
                    "so that every rank loads as many items"
                )
        return ShardedIterableDataset(dataset, rank, world, drop_last)
    if shard is None and (world > 1 or workers > 1):
        warn(
            f"{type(dataset).__name__} is an IterableDataset and is not sharded: every rank"
            f"{' and worker' if workers > 1 else ''} loads all of its items. Pass shard_iterable=True to give each "
            "item to one rank (and worker), or shard_iterable=False if the dataset splits itself"
        )
    return dataset
