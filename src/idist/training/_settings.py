"""Reading a ``DataLoader``'s settings back, so ``auto_dataloader`` can rebuild it per rank.

An ``AutoDataLoader`` reads back as what built it: its global batch, its dataset before
sharding, its sampler's shuffle, seed and inner sampler. Overriding a setting drops the ones
that only went with it (a loader's worker settings when ``num_workers=0``, its batch sampler
when a batch size or sampler is given).
"""

from __future__ import annotations

from typing import SupportsIndex, TypeVar, cast

from torch.utils.data import DataLoader, Dataset, IterableDataset, RandomSampler, Sampler, SequentialSampler
from torch.utils.data._utils.collate import default_collate, default_convert

from ._iterable import ShardedIterableDataset
from ._options import AutoDataLoaderOptions
from ._sampler import DistributedProxySampler, ShardSampler, _ShardedBase

T = TypeVar("T")

#: what only a loader with workers may have
_WORKER_ONLY = ("prefetch_factor", "persistent_workers", "multiprocessing_context", "timeout")
#: what replaces a loader's batch sampler
_BATCHING = ("batch_size", "per_rank_batch_size", "drop_last", "shuffle", "sampler")


def the_data(data: object, dataset: object, dataloader: object) -> Dataset[object] | DataLoader[object]:
    """The one data argument among ``data``, ``dataset=`` (ignite's name) and ``dataloader=``."""
    given = {"data": data, "dataset": dataset, "dataloader": dataloader}
    passed = [k for k, v in given.items() if v is not None]
    if len(passed) != 1:
        raise TypeError(
            "auto_dataloader takes its data once: positionally, as dataset= or as dataloader=; "
            f"got {', '.join(passed) or 'none of them'}"
        )
    return cast("Dataset[object] | DataLoader[object]", given[passed[0]])


def settings_of(loader: DataLoader[T]) -> tuple[Dataset[T], AutoDataLoaderOptions]:
    """The keyword arguments that rebuild ``loader`` (its sampler as shuffle= when standard)."""
    global_batch = getattr(loader, "global_batch_size", None)
    auto = hasattr(loader, "global_batch_size")  # an AutoDataLoader: its generator is its own
    kw: AutoDataLoaderOptions = {
        "num_workers": loader.num_workers,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
    }
    if not auto:
        kw["generator"] = loader.generator
    if loader.pin_memory:
        kw["pin_memory"] = True
    if loader.collate_fn not in (default_collate, default_convert):
        kw["collate_fn"] = loader.collate_fn
    if loader.num_workers > 0:
        kw["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        kw["in_order"] = loader.in_order
    if loader.batch_size is None and loader.batch_sampler is not None:
        kw["batch_sampler"] = loader.batch_sampler
        return loader.dataset, kw
    kw["batch_size"] = global_batch if isinstance(global_batch, int) else loader.batch_size
    kw["drop_last"] = loader.drop_last
    if isinstance(loader.dataset, ShardedIterableDataset):
        kw["shard_iterable"] = True
        return cast("Dataset[T]", loader.dataset.dataset), kw
    if isinstance(loader.dataset, IterableDataset):
        return loader.dataset, kw
    sampler = loader.sampler
    if isinstance(sampler, _ShardedBase):
        kw["seed"] = sampler.seed
        kw["even_batches"] = sampler.even_batches if sampler._empty_pads is None else not sampler._empty_pads
    if isinstance(sampler, ShardSampler):
        kw["shuffle"] = sampler.shuffle
    elif isinstance(sampler, DistributedProxySampler):
        kw["sampler"] = sampler.sampler
    elif type(sampler) is SequentialSampler:
        kw["shuffle"] = False
    elif type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None:
        kw["shuffle"] = True
        if sampler.generator is not None:
            kw["seed"] = sampler.generator.initial_seed()
    else:
        # torch also takes a plain iterable here; auto_dataloader refuses it (UnsupportedSamplerError)
        kw["sampler"] = cast("Sampler[SupportsIndex]", sampler)
    return loader.dataset, kw


def merge(derived: AutoDataLoaderOptions, kwargs: AutoDataLoaderOptions) -> AutoDataLoaderOptions:
    """The loader's settings, overridden by the caller's (a new sampler replaces the old one)."""
    out = derived.copy()
    if "sampler" in kwargs or "shuffle" in kwargs or "batch_sampler" in kwargs:
        out.pop("sampler", None)
        out.pop("shuffle", None)
        out.pop("seed", None)
    if "batch_sampler" in kwargs:
        out.pop("batch_size", None)
        out.pop("drop_last", None)
    elif "batch_sampler" in out and any(k in kwargs for k in _BATCHING):
        old = out.pop("batch_sampler")  # batches made anew: keep what the old batch sampler said
        size, drop = getattr(old, "batch_size", None), getattr(old, "drop_last", None)
        if isinstance(size, int) and "batch_size" not in kwargs:
            out["batch_size"] = size
        if isinstance(drop, bool) and "drop_last" not in kwargs:
            out["drop_last"] = drop
    if "per_rank_batch_size" in kwargs:
        out.pop("batch_size", None)
    if kwargs.get("num_workers") == 0:  # the loader's worker settings went with its workers
        plain = cast("dict[str, object]", out)
        for key in _WORKER_ONLY:
            if key not in kwargs:
                plain.pop(key, None)
    out.update(kwargs)
    return out
