"""Samplers that give each rank its share of an epoch.

``ShardSampler`` shards ``range(n)`` (shuffled by ``seed + epoch`` when asked);
``DistributedProxySampler`` shards what a user's sampler yields, run under a private seed so
every rank sees the same sequence and the global RNGs stay untouched. Rank ``r`` of ``W``
takes positions ``r, r + W, ...``; nothing is padded (every sample once per epoch) unless
``even_batches=True`` must repeat up to ``W - 1`` samples so ranks run as many batches as
each other. Both are ``DistributedSampler`` subclasses; their epoch is the one the next pass uses.
"""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Callable, Iterator, Sized
from typing import TYPE_CHECKING, Protocol, SupportsIndex, TypedDict, cast, final

import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler

from .._errors import TrainingSetupError, UnsupportedSamplerError
from ._warn import warn

if TYPE_CHECKING:
    from ._feed import Feed


class _Seeded(Protocol):
    """A sampler that draws from ``generator`` (every torch sampler that shuffles)."""

    generator: torch.Generator | None


#: the global RNGs are process-wide; a proxy sampler forks them under this lock
_GLOBAL_RNG_LOCK = threading.Lock()


def _from_the_package() -> tuple[int, int]:
    # `import idist.training` alone imports no stack (idist's names load on first use): ask the
    # package, whose `current` loads the stack, which then sets `_current_topology` itself
    from .. import current  # deferred: the public API sits above training/ (and imports it)

    ctx = current()
    return ctx.world_size, ctx.rank


#: (world size, rank) of the current context, for a ``DistributedProxySampler`` given neither.
#: training/ sits below the context stack, so the stack sets this when it is imported
#: (``use_current_topology``); until then the package's public ``current`` answers.
_current_topology: Callable[[], tuple[int, int]] = _from_the_package


def use_current_topology(source: Callable[[], tuple[int, int]]) -> None:
    """Where ``DistributedProxySampler`` takes the ``num_replicas``/``rank`` its caller left out."""
    global _current_topology
    _current_topology = source


def shard_plan(length: int, world_size: int, drop_last: bool, even_batches: bool, batch_size: int | None) -> int:
    """How many positions of the epoch's sequence are used (more than ``length`` = padded).

    Padding happens only with ``even_batches`` when ``batch_size`` batches would leave
    some rank with one batch fewer than another.
    """
    if drop_last:
        return length - length % world_size
    if even_batches and length % world_size and uneven_batches(length, world_size, batch_size):
        return length + world_size - length % world_size
    return length


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def rank_count(total: int, world_size: int, rank: int) -> int:
    """Positions ``rank, rank + W, ...`` below ``total``."""
    return len(range(rank, total, world_size))


def uneven_batches(total: int, world_size: int, batch_size: int | None) -> bool:
    """Whether rank 0 and the last rank would run different numbers of batches."""
    b = batch_size or 1
    first = -(-rank_count(total, world_size, 0) // b)
    last = -(-rank_count(total, world_size, world_size - 1) // b)
    return first != last


class ShardOptions(TypedDict):
    """How both samplers share out the epoch, past ``num_replicas`` and ``rank`` (their keyword-only options)."""

    seed: int
    drop_last: bool
    even_batches: bool
    batch_size: int | None


class _ShardedBase(DistributedSampler[int]):
    """Shards the epoch's sequence; subclasses say what the sequence is."""

    def __init__(
        self,
        dataset: Sized,
        *,
        num_replicas: int,
        rank: int,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        even_batches: bool = False,
        batch_size: int | None = None,
    ) -> None:
        if not 0 <= rank < num_replicas:
            raise TrainingSetupError(f"rank={rank} is outside 0..{num_replicas - 1}")
        length = len(dataset)
        source = cast("Dataset[object]", dataset)  # DistributedSampler only takes its len()
        super().__init__(source, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.length = length
        self.even_batches = even_batches
        self.total_size = shard_plan(length, num_replicas, drop_last, even_batches, batch_size)
        self.num_samples = rank_count(self.total_size, num_replicas, rank)
        #: global positions the next pass skips (a resumed epoch, ``load_state_dict``); its ``__iter__`` clears it
        self.start = 0
        #: set by ``set_epoch``, cleared when a loader starts a pass (an explicit epoch wins)
        self.epoch_was_set = False
        #: set by auto_dataloader: the context's feed, and whether a batch of repeated samples is emptied
        self._feed: Feed | None = None
        self._empty_pads: bool | None = None
        if num_replicas > 1 and not drop_last and not even_batches and uneven_batches(length, num_replicas, batch_size):
            b = batch_size or 1
            first = -(-rank_count(length, num_replicas, 0) // b)
            warn(
                f"{length} samples over {num_replicas} replicas{f' in batches of {b}' if batch_size else ''}: "
                f"some ranks run {first} {'batches' if batch_size else 'samples'} per epoch, others {first - 1}, "
                "and DDP training blocks on the extra step. Pass even_batches=True to repeat "
                f"{_count(num_replicas - length % num_replicas, 'sample')} (as ignite's DistributedProxySampler "
                "and torch's DistributedSampler always do), or drop_last=True"
            )

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next pass (wins over the loader's automatic advance)."""
        self.epoch = int(epoch)
        self.epoch_was_set = True

    def _sequence(self) -> list[int]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[int]:  # positions r, r + W, ... of the epoch's sequence
        seq = self._sequence()
        if self.total_size > len(seq):  # even_batches: repeat from the start
            seq = (seq * (-(-self.total_size // max(len(seq), 1))))[: self.total_size]
        start, self.start = self.start, 0
        return iter(seq[start + self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        if self.start:
            return rank_count(max(self.total_size - self.start, 0), self.num_replicas, self.rank)
        return self.num_samples


@final
class ShardSampler(_ShardedBase):
    """Rank ``rank``'s share of ``range(len(dataset))``, reshuffled per epoch when ``shuffle``.

    The permutation is ``torch.randperm(n, generator=seed + epoch)``, the one
    ``DistributedSampler`` draws, from a private generator.
    """

    def _sequence(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.length))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.length, generator=g).tolist()


@final
class DistributedProxySampler(_ShardedBase):
    """Rank ``rank``'s share of what ``sampler`` yields in this epoch (ignite's name and signature).

    ``num_replicas`` and ``rank`` default to the current context's world size and rank.

    ``sampler`` runs with a private ``generator`` (when it has that attribute, as every
    torch sampler does) and with the global torch, ``random`` and numpy RNGs forked and
    seeded from ``seed + epoch``; all are restored afterwards, so the caller's RNG state is
    the same before and after a pass and every rank draws the same sequence. What it yields
    (indices, or any keys the dataset takes) is passed on unchanged. It must have a length.
    """

    def __init__(
        self,
        sampler: Sampler[SupportsIndex],
        num_replicas: int | None = None,
        rank: int | None = None,
        *,
        seed: int = 0,
        drop_last: bool = False,
        even_batches: bool = False,
        batch_size: int | None = None,
    ) -> None:
        if not isinstance(sampler, Sampler):
            raise UnsupportedSamplerError(f"sampler must be a torch.utils.data.Sampler, got {type(sampler).__name__}")
        if isinstance(sampler, DistributedSampler):
            raise UnsupportedSamplerError("this sampler is already a DistributedSampler; pass it as it is")
        if not isinstance(sampler, Sized):
            raise UnsupportedSamplerError(
                f"{type(sampler).__name__} has no __len__; a sampler shared out between ranks needs a fixed length"
            )
        if num_replicas is None or rank is None:
            world_size, current_rank = _current_topology()
            num_replicas = world_size if num_replicas is None else num_replicas
            rank = current_rank if rank is None else rank
        self.sampler = sampler
        shard = ShardOptions(seed=seed, drop_last=drop_last, even_batches=even_batches, batch_size=batch_size)
        super().__init__(sampler, num_replicas=num_replicas, rank=rank, **shard)

    def _sequence(self) -> list[int]:
        seed = self.seed + self.epoch
        private = torch.Generator()
        private.manual_seed(seed)
        has_gen = hasattr(self.sampler, "generator")
        seeded = cast(_Seeded, self.sampler)
        saved_gen = getattr(self.sampler, "generator", None)
        np = sys.modules.get("numpy")  # a sampler can only draw from numpy's RNG once numpy is imported
        with _GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=[]):
            py_state = random.getstate()
            np_state = None if np is None else np.random.get_state()
            torch.manual_seed(seed)
            random.seed(seed)
            if np is not None:
                np.random.seed(seed % 2**32)
            try:
                if has_gen:
                    seeded.generator = private
                seq = cast("list[int]", list(self.sampler))  # keys as they are: a dataset may take strings
            finally:
                if has_gen:
                    seeded.generator = saved_gen
                random.setstate(py_state)
                if np is not None:
                    np.random.set_state(np_state)
        if len(seq) != self.length:
            raise TrainingSetupError(
                f"{type(self.sampler).__name__} yielded {len(seq)} indices but its len() is {self.length}; "
                "a sampler shared out between ranks must yield len() indices every epoch"
            )
        return seq
