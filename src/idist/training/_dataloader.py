"""``auto_dataloader``: one loader definition, the same global batches on any world size.

``batch_size`` is the **global** batch (as in ignite; ``per_rank_batch_size=`` says the
per-rank size; none means 1). A dataset without a sampler is sharded by ``ShardSampler`` (also
serially, so 1 process at batch B and N ranks at B/N draw the same global batches); a user's
``DistributedSampler`` is kept; any other sampler is wrapped in ``DistributedProxySampler``; an
``IterableDataset`` is sharded with ``shard_iterable=True`` (``_iterable``). Every rank runs the
same steps: a rank the last step leaves without a sample gets an empty batch there. The
``AutoDataLoader`` keeps the epoch clock (``_epochs``); ``num_workers`` is a per-node total.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator, Mapping, Sized
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, IterableDataset
from torch.utils.data.dataloader import (
    _BaseDataLoaderIter,
    _MultiProcessingDataLoaderIter,
    _SingleProcessDataLoaderIter,
)
from typing_extensions import Unpack

from .._errors import TrainingSetupError
from ._epochs import EpochClock, LoaderState, Pass, Steps, position, restore, warn_tail
from ._feed import Feed, feed_of
from ._iterable import ShardedIterableDataset, shard_or_warn
from ._options import AutoDataLoaderOptions, DataLoaderOptions
from ._sampler import DistributedProxySampler, ShardOptions, ShardSampler, _ShardedBase
from ._settings import merge, settings_of
from ._warn import warn

if TYPE_CHECKING:
    from .._context import DistContext

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

logger = logging.getLogger("idist.training")


class AutoDataLoader(DataLoader[T_co]):
    """A ``DataLoader`` whose sampler's epoch advances after every pass that runs to its end.

    A pass left early (a look at one batch, a ``break``) changes nothing; an epoch set
    explicitly wins: ``loader.set_epoch(e)``, or ``sampler.set_epoch(e)``. ``global_batch_size``
    is the batch all ranks load together per step (None without automatic batching or with a
    custom ``batch_sampler``). Rebuilt from its public attributes (ignite's
    ``update_dataloader``), it keeps its clock: the epoch lives in the sampler.
    """

    def __init__(
        self, dataset: Dataset[T_co], *, global_batch_size: int | None = None, **kwargs: Unpack[DataLoaderOptions]
    ) -> None:
        super().__init__(dataset, **kwargs)
        self.global_batch_size = global_batch_size
        target = next((t for t in _samplers(self) if callable(getattr(t, "set_epoch", None))), None)
        self._clock = EpochClock(target) if target is not None else None
        # torch's BatchSampler over idist's sampler (ignite's ReproducibleBatchSampler wraps one)
        batches = next((b for b in _samplers(self) if type(b) is BatchSampler), None)
        sharded = getattr(batches, "sampler", None)
        self._steps: Steps | None = None
        self._feed: Feed | None = None
        #: idist's sampler under torch's BatchSampler: the one order whose position a state can hold
        self._sharded: _ShardedBase | None = None
        #: the last pass begun, while its iterator lives (a pass left early is forgotten with it)
        self._pass: weakref.ref[Pass] | None = None
        if isinstance(batches, BatchSampler) and isinstance(sharded, _ShardedBase):
            self._steps = Steps(sharded, batches.batch_size, bool(sharded._empty_pads))
            self._feed, self._sharded = sharded._feed, sharded
        #: (world size, rank) auto_dataloader built it for: wrapping it again there changes nothing
        self._built_for: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next pass (the sampler reshuffles by it)."""
        if self._clock is None:
            raise TrainingSetupError("this loader's sampler has no set_epoch(); its order does not depend on epochs")
        self._clock.set_epoch(epoch)

    @property
    def epoch(self) -> int | None:
        """The epoch of the current (or last) pass; None before the first one."""
        return None if self._clock is None else self._clock.last

    def state_dict(self) -> LoaderState:
        """``{"epoch", "samples", "global_batch"}``: the pass under way (else the next one) and the
        global samples it yielded; the same on every rank, whatever the world size."""
        current = self._pass() if self._pass is not None else None
        return position(self._clock, current, self._sharded, self.global_batch_size)

    def load_state_dict(self, state: Mapping[str, object], /) -> None:
        """Continue from ``state`` (any world size): the next pass yields the rest of its epoch's global
        batches over this loader's ranks. ``TrainingSetupError`` if this loader's global batch differs."""
        restore(self._clock, self._sharded, self.global_batch_size, state)
        self._pass = None

    def __len__(self) -> int:
        ds = self.dataset
        if isinstance(ds, ShardedIterableDataset) and isinstance(ds.dataset, Sized) and self.batch_size is not None:
            return ds.batches(self.batch_size, self.drop_last, self.num_workers)
        return super().__len__()

    def _get_iterator(self) -> _BaseDataLoaderIter:
        if self.num_workers == 0:
            return _OneProcess(self)
        self.check_worker_number_rationality()
        return _Workers(self)

    def _loading_pass(self) -> tuple[Pass, Iterator[Any]]:
        """A pass begun now, and torch's iterator that only loads it (the caller reports its batches)."""
        it = cast("_Tracked", DataLoader.__iter__(self))  # _get_iterator's
        return it.detach(), it

    def _begin_pass(self) -> Pass:
        start = getattr(self.batch_sampler, "start_iteration", None)  # ignite's ReproducibleBatchSampler resumes
        if not isinstance(start, int):
            start = self._sharded.start // self._steps.global_batch if self._sharded and self._steps else 0
        begun = Pass(self._clock, start, self._steps, self._feed)
        self._pass = weakref.ref(begun)
        return begun


def _samplers(loader: DataLoader[Any]) -> list[object]:
    """Where a loader's order comes from, outermost first (a batch sampler may wrap another)."""
    outer = loader.batch_sampler
    return [outer, getattr(outer, "batch_sampler", None), getattr(outer, "sampler", None), loader.sampler]


class _Tracked(_BaseDataLoaderIter):
    """An iterator that reports each batch, and the end of its pass, to the pass's bookkeeping."""

    _pass: Pass | None  # None once detached

    def detach(self) -> Pass:
        """Hand the pass to the iterator the model reads (a device loader reading this one ahead of it)."""
        begun, self._pass = self._pass, None
        assert begun is not None, "a pass is detached once"
        return begun

    def __next__(self) -> Any:
        try:
            data = super().__next__()
        except StopIteration:
            if self._pass is not None:
                self._pass.end()
            raise
        return data if self._pass is None else self._pass.batch(data)


class _OneProcess(_Tracked, _SingleProcessDataLoaderIter):
    def __init__(self, loader: AutoDataLoader[Any]) -> None:
        self._pass = loader._begin_pass()  # before the sampler is iterated: it reads the pass's epoch
        super().__init__(loader)


class _Workers(_Tracked, _MultiProcessingDataLoaderIter):
    def __init__(self, loader: AutoDataLoader[Any]) -> None:
        self._pass = loader._begin_pass()
        super().__init__(loader)

    def _reset(self, loader: AutoDataLoader[Any], first_iter: bool = False) -> None:
        if not first_iter:  # persistent workers: a new pass over the same iterator
            self._pass = loader._begin_pass()
        super()._reset(loader, first_iter)


def auto_dataloader(
    ctx: DistContext, data: Dataset[T] | DataLoader[T], **kwargs: Unpack[AutoDataLoaderOptions]
) -> AutoDataLoader[T]:
    """See ``DistContext.auto_dataloader``."""
    if isinstance(data, AutoDataLoader) and not kwargs and data._built_for == (ctx.world_size, ctx.rank):
        return data
    if isinstance(data, DataLoader):
        dataset, derived = settings_of(data)
        kwargs = merge(derived, kwargs)
    else:
        dataset = data
    loader = _build(ctx, dataset, kwargs)
    return ctx._adapt_loader(loader)


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TrainingSetupError(f"{name} must be a positive int, got {value!r}")
    return value


def _per_rank_batch(ctx: DistContext, kw: DataLoaderOptions, per_rank: object) -> tuple[int | None, int | None]:
    """(per-rank batch, global batch) from ``batch_size`` (global; torch's default 1) or ``per_rank_batch_size``."""
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
    total = kw.pop("batch_size", 1)
    if total is None:
        return None, None
    total = _positive_int("batch_size", total)
    b = max(1, total // world)
    if b * world != total:
        warn(
            f"batch_size={total} is the global batch and does not divide by the world size {world}: "
            f"each rank loads {b}, so the global batch is {b * world}; pass a multiple of {world}, "
            "or per_rank_batch_size="
        )
    return b, b * world


def _build(ctx: DistContext, dataset: Dataset[T], options: AutoDataLoaderOptions) -> AutoDataLoader[T]:
    options = options.copy()
    world, rank = ctx.world_size, ctx.rank
    seed = options.pop("seed", None)
    shard_iterable = options.pop("shard_iterable", None)
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
        kw["num_workers"] = workers = -(-workers // ctx.nproc_per_node)
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
    feed = feed_of(ctx)
    if "batch_sampler" in kw:
        if world > 1:
            warn("a custom batch_sampler is used as it is: make sure it gives each rank its own batches")
    elif isinstance(dataset, IterableDataset):
        dataset = shard_or_warn(dataset, ctx.rank, ctx.world_size, shard_iterable, kw, b)
    else:
        if shard_iterable:
            raise TrainingSetupError(
                "shard_iterable=True is for an IterableDataset; a map-style dataset is sharded by its sampler"
            )
        sampler = kw["sampler"] = _sampler(ctx, dataset, kw, seed, b)
        if isinstance(sampler, _ShardedBase):
            sampler._feed, sampler._empty_pads = feed, not even_batches
            warn_tail(sampler, b, bool(kw.get("drop_last", False)), even_batches)
    logger.info("auto_dataloader on rank %d/%d: %s", rank, world, kw)
    loader = AutoDataLoader(dataset, global_batch_size=global_batch, **kw)
    loader._feed, loader._built_for = feed, (world, rank)
    return loader


def _sampler(
    ctx: DistContext, dataset: object, kw: DataLoaderOptions, seed: int, b: int | None
) -> DistributedSampler[int]:
    """The rank's sampler; idist's pad the last step so that every rank runs as many batches."""
    world, rank = ctx.world_size, ctx.rank
    sampler = kw.pop("sampler", None)
    shuffle = kw.pop("shuffle", False)
    drop_last = bool(kw.get("drop_last", False))
    if sampler is not None and shuffle:
        raise TrainingSetupError("sampler= and shuffle=True exclude each other: shuffle inside the sampler")
    if isinstance(sampler, DistributedSampler):
        if (sampler.rank, sampler.num_replicas) != (rank, world):
            warn(
                f"the DistributedSampler passed in has rank={sampler.rank}, num_replicas={sampler.num_replicas}, "
                f"but this is rank {rank} of {world}: it is used as it is"
            )
        return sampler
    shard = ShardOptions(seed=seed, drop_last=drop_last, even_batches=True, batch_size=b)
    if sampler is not None:
        return DistributedProxySampler(sampler, world, rank, **shard)
    if not isinstance(dataset, Sized):
        raise TrainingSetupError(f"{type(dataset).__name__} has no __len__: make it a Dataset or an IterableDataset")
    return ShardSampler(dataset, num_replicas=world, rank=rank, shuffle=bool(shuffle), **shard)
