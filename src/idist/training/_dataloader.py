"""``auto_dataloader``: one loader definition, the same global batches on any world size.

``batch_size`` is the **global** batch (as in ignite; ``per_rank_batch_size=`` says the
per-rank size). A dataset without a sampler is sharded by ``ShardSampler`` (also serially,
so 1 process at batch B and N ranks at B/N draw the same global batches); a user's
``DistributedSampler`` is kept; any other sampler is wrapped in ``DistributedProxySampler``. An
``IterableDataset`` is sharded by rank and worker with ``shard_iterable=True``.
``num_workers`` is a per-node total (kept per process when smaller); the loader gets a private generator, and the
returned ``AutoDataLoader`` advances its sampler's epoch on every new pass.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterator, Sized
from itertools import islice
from types import FrameType
from typing import TYPE_CHECKING, TypeVar, final

import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    get_worker_info,
)
from torch.utils.data.dataloader import _BaseDataLoaderIter
from typing_extensions import Unpack

from .._errors import TrainingSetupError
from ._options import AutoDataLoaderOptions, DataLoaderOptions
from ._sampler import DistributedProxySampler, EpochClock, ShardSampler, rank_count, uneven_batches
from ._settings import merge, settings_of

if TYPE_CHECKING:
    from .._context import DistContext

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

logger = logging.getLogger("idist.training")


class AutoDataLoader(DataLoader[T_co]):
    """A ``DataLoader`` whose sampler's epoch advances by one on every new pass.

    An epoch set explicitly since the last pass wins: ``loader.set_epoch(e)``, or
    ``sampler.set_epoch(e)`` on an idist sampler (on another sampler: a changed ``.epoch``).
    ``global_batch_size`` is the batch all ranks load together per step (None without
    automatic batching or with a custom ``batch_sampler``).
    """

    def __init__(
        self,
        dataset: Dataset[T_co],
        *,
        global_batch_size: int | None,
        epoch_target: object,
        **kwargs: Unpack[DataLoaderOptions],
    ) -> None:
        super().__init__(dataset, **kwargs)
        self.global_batch_size = global_batch_size
        self._clock = EpochClock(epoch_target) if hasattr(epoch_target, "set_epoch") else None

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next pass (the sampler reshuffles by it)."""
        if self._clock is None:
            raise TrainingSetupError("this loader's sampler has no set_epoch(); its order does not depend on epochs")
        self._clock.set_epoch(epoch)

    @property
    def epoch(self) -> int | None:
        """The epoch of the current (or last) pass; None before the first one."""
        return None if self._clock is None else self._clock.last

    def __iter__(self) -> _BaseDataLoaderIter:
        if self._clock is not None:
            self._clock.before_pass()
        return super().__iter__()


@final
class ShardedIterableDataset(IterableDataset[T]):
    """Item ``i`` of ``dataset`` goes to one (rank, worker) pair: round robin over all of them."""

    def __init__(self, dataset: IterableDataset[T], rank: int, world_size: int) -> None:
        self.dataset = dataset
        self.rank = rank
        self.world_size = world_size

    def __iter__(self) -> Iterator[T]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        shard = self.rank * workers + worker
        return islice(iter(self.dataset), shard, None, self.world_size * workers)


def auto_dataloader(
    ctx: DistContext, data: Dataset[T] | DataLoader[T], **kwargs: Unpack[AutoDataLoaderOptions]
) -> AutoDataLoader[T]:
    """See ``DistContext.auto_dataloader``."""
    if isinstance(data, DataLoader):
        dataset, derived = settings_of(data)
        kwargs = merge(derived, kwargs)
    else:
        dataset = data
    loader = _build(ctx, dataset, kwargs)
    return ctx._adapt_loader(loader)


def _warn(message: str) -> None:
    """A UserWarning attributed to the caller's line, not to idist's own frames."""
    package = os.path.dirname(os.path.dirname(__file__))
    frame: FrameType | None = sys._getframe(1)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, UserWarning, stacklevel=level)


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TrainingSetupError(f"{name} must be a positive int, got {value!r}")
    return value


def _per_rank_batch(ctx: DistContext, kw: DataLoaderOptions, per_rank: object) -> tuple[int | None, int | None]:
    """(per-rank batch, global batch) from ``batch_size`` (global) or ``per_rank_batch_size``."""
    world = ctx.world_size
    if "batch_sampler" in kw:
        if "batch_size" in kw or per_rank is not None:
            raise TrainingSetupError("batch_sampler decides the batches: drop batch_size / per_rank_batch_size")
        return None, None
    if per_rank is not None:
        if "batch_size" in kw:
            raise TrainingSetupError(
                "pass batch_size (the global batch) or per_rank_batch_size, not both "
                f"(got batch_size={kw['batch_size']!r}, per_rank_batch_size={per_rank!r})"
            )
        b = _positive_int("per_rank_batch_size", per_rank)
        return b, b * world
    if "batch_size" not in kw:
        return 1, world  # torch's default: one sample per rank and step
    if kw["batch_size"] is None:
        return None, None
    total = _positive_int("batch_size", kw.pop("batch_size"))
    b = max(1, total // world)
    if b * world != total:
        _warn(
            f"batch_size={total} is the global batch and does not divide by the world size {world}: "
            f"each rank loads {b}, so the global batch is {b * world}; pass a multiple of {world}, "
            "or per_rank_batch_size="
        )
    return b, b * world


def _build(ctx: DistContext, dataset: Dataset[T], options: AutoDataLoaderOptions) -> AutoDataLoader[T]:
    options = options.copy()
    world, rank = ctx.world_size, ctx.rank
    seed = options.pop("seed", None)
    shard_iterable = options.pop("shard_iterable", False)
    even_batches = bool(options.pop("even_batches", False))
    per_rank = options.pop("per_rank_batch_size", None)
    kw: DataLoaderOptions = options  # without idist's own keys from here on
    b, global_batch = _per_rank_batch(ctx, kw, per_rank)
    if "batch_sampler" not in kw:
        kw["batch_size"] = b
    workers = kw.get("num_workers", 0)
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
        raise TrainingSetupError(f"num_workers must be an int >= 0, got {workers!r}")
    if workers >= ctx.nproc_per_node > 1:  # a per-node total, as in ignite (fewer are kept per process)
        kw["num_workers"] = -(-workers // ctx.nproc_per_node)
    kw["pin_memory"] = ctx._loader_pin_memory(kw.get("pin_memory"))
    user_gen = kw.get("generator")
    if seed is None:
        seed = user_gen.initial_seed() if isinstance(user_gen, torch.Generator) else 0
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TrainingSetupError(f"seed must be an int, got {seed!r}")
    if user_gen is None:
        private = torch.Generator()
        private.manual_seed((seed * 1_000_003 + rank) % (1 << 63))
        kw["generator"] = private
    target: object = None
    if "batch_sampler" in kw:
        target = kw["batch_sampler"]
        if world > 1:
            _warn("a custom batch_sampler is used as it is: make sure it gives each rank its own batches")
    elif isinstance(dataset, IterableDataset):
        dataset = _iterable(dataset, ctx, shard_iterable, kw["num_workers"] if workers else 0)
    else:
        if shard_iterable:
            raise TrainingSetupError(
                "shard_iterable=True is for an IterableDataset; a map-style dataset is sharded by its sampler"
            )
        target = kw["sampler"] = _sampler(ctx, dataset, kw, seed, even_batches, b)
    logger.info("auto_dataloader on rank %d/%d: %s", rank, world, kw)
    return AutoDataLoader(dataset, global_batch_size=global_batch, epoch_target=target, **kw)


def _iterable(dataset: IterableDataset[T], ctx: DistContext, shard: object, workers: int) -> IterableDataset[T]:
    if shard:
        return ShardedIterableDataset(dataset, ctx.rank, ctx.world_size)
    if ctx.world_size > 1 or workers > 1:
        logger.info(
            "%s is an IterableDataset and is not sharded: each rank (and worker) must produce its own "
            "data, or pass shard_iterable=True",
            type(dataset).__name__,
        )
    return dataset


def _sampler(
    ctx: DistContext, dataset: object, kw: DataLoaderOptions, seed: int, even_batches: bool, b: int | None
) -> DistributedSampler[int]:
    world, rank = ctx.world_size, ctx.rank
    sampler = kw.pop("sampler", None)
    shuffle = kw.pop("shuffle", False)
    drop_last = bool(kw.get("drop_last", False))
    if sampler is not None and shuffle:
        raise TrainingSetupError("sampler= and shuffle=True exclude each other: shuffle inside the sampler")
    if isinstance(sampler, DistributedSampler):
        if (sampler.rank, sampler.num_replicas) != (rank, world):
            _warn(
                f"the DistributedSampler passed in has rank={sampler.rank}, num_replicas={sampler.num_replicas}, "
                f"but this is rank {rank} of {world}: it is used as it is"
            )
        return sampler
    made: ShardSampler | DistributedProxySampler
    if sampler is None:
        if not isinstance(dataset, Sized):
            raise TrainingSetupError(
                f"{type(dataset).__name__} has no __len__: make it a Dataset or an IterableDataset"
            )
        made = ShardSampler(
            dataset,
            num_replicas=world,
            rank=rank,
            shuffle=bool(shuffle),
            seed=seed,
            drop_last=drop_last,
            even_batches=even_batches,
            batch_size=b,
        )
    else:
        made = DistributedProxySampler(
            sampler,
            num_replicas=world,
            rank=rank,
            seed=seed,
            drop_last=drop_last,
            even_batches=even_batches,
            batch_size=b,
        )
    if world > 1 and not drop_last and uneven_batches(made.total_size, world, b):
        first = -(-rank_count(made.total_size, world, 0) // (b or 1))
        _warn(
            f"{made.length} samples with a global batch of {(b or 1) * world} leave a last batch smaller than "
            f"the world size: some ranks run {first} batches per epoch, others {first - 1}. Fine for evaluation; "
            "DDP training blocks on the extra step: pass drop_last=True, or even_batches=True to repeat "
            f"{world - made.length % world} samples"
        )
    return made
