"""The epoch clock of an ``AutoDataLoader``, and what each rank holds of an epoch's global steps.

A pass (one ``iter(loader)``) uses the epoch its sampler holds. Only a pass that runs to its
end advances it (writes ``epoch + 1`` to the sampler), and not when an epoch was set
explicitly since the pass began: a look at one batch, or a loop left early, changes nothing.
The clock's state is the sampler's epoch plus the global samples a pass has yielded; ranks
that took the same passes hold the same state. ``Steps`` says, from the sampler's plan alone,
how many real samples this rank and the whole step hold at step k (its gradient's weight),
and which batches hold only repeated samples (emptied unless ``even_batches=True``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, TypedDict, TypeVar, cast, final

import torch

from .._errors import TrainingSetupError
from ._sampler import _count, _ShardedBase, rank_count
from ._warn import warn

if TYPE_CHECKING:
    from ._feed import Feed

T = TypeVar("T")


class _HasEpoch(Protocol):
    def set_epoch(self, epoch: int) -> None: ...


@final
class EpochClock:
    """Advances ``target``'s epoch (a sampler or batch sampler with ``set_epoch``) after each whole pass.

    idist's samplers say themselves whether ``set_epoch`` was called since the pass began;
    on another target a changed ``.epoch`` counts as explicit (a target without ``.epoch`` is
    told each pass's epoch by ``set_epoch`` when the pass begins).
    """

    def __init__(self, target: object) -> None:
        self.target = target
        #: the epoch of the current (or last) pass; None before the first
        self.last: int | None = None
        self._next = 0
        self._explicit = False

    def set_epoch(self, epoch: int) -> None:
        epoch = int(epoch)
        cast(_HasEpoch, self.target).set_epoch(epoch)
        self._next, self._explicit = epoch, True

    def begin(self) -> int:
        """The epoch of a pass that starts now."""
        t = self.target
        current = getattr(t, "epoch", None)
        if isinstance(t, _ShardedBase):
            t.epoch_was_set = False
        if isinstance(current, int):
            epoch = current
        else:
            epoch = self._next
            cast(_HasEpoch, t).set_epoch(epoch)
        self._explicit = False
        self.last = epoch
        return epoch

    def finish(self, epoch: int) -> None:
        """A pass of ``epoch`` ran to its end: the next one uses ``epoch + 1`` unless one was set since."""
        t = self.target
        if isinstance(t, _ShardedBase):
            if not t.epoch_was_set:
                t.epoch = epoch + 1
            return
        current = getattr(t, "epoch", None)
        if self._explicit or (isinstance(current, int) and current != epoch):
            return
        self._next = epoch + 1
        cast(_HasEpoch, t).set_epoch(epoch + 1)


@final
class Steps:
    """What rank ``sampler.rank`` holds of each global step, batches of ``per_rank`` from ``sampler``.

    Step k covers positions ``[kG, (k + 1)G)`` of the epoch's sequence (G = per_rank x W), and
    rank r's batch k holds those congruent to r modulo W. Positions past the dataset's length
    are repeats (``even_batches``): they weigh nothing.
    """

    def __init__(self, sampler: _ShardedBase, per_rank: int, empty_pads: bool) -> None:
        self.world, self.rank, self.length = sampler.num_replicas, sampler.rank, sampler.length
        self.global_batch = per_rank * self.world
        #: steps below this one are full on every rank (weight 1)
        self.full = self.length // self.global_batch
        self.empty_pads = empty_pads

    def share(self, step: int) -> tuple[float, bool]:
        """(this rank's gradient weight at ``step``, whether its batch is to be emptied)."""
        if step < self.full:
            return 1.0, False
        real = max(0, min(self.global_batch, self.length - step * self.global_batch))
        mine = rank_count(real, self.world, self.rank)
        if mine == 0:
            return 0.0, self.empty_pads
        return self.world * mine / real, False

    def tail(self) -> list[int]:
        """Each rank's real samples in the last step; empty when every step is full."""
        real = self.length % self.global_batch
        return [rank_count(real, self.world, r) for r in range(self.world)] if real else []


@final
class Pass:
    """One pass over a loader: its epoch, the next step, and where each batch's weight goes."""

    __slots__ = ("__weakref__", "clock", "done", "epoch", "feed", "step", "steps")

    def __init__(self, clock: EpochClock | None, start: int, steps: Steps | None, feed: Feed | None) -> None:
        self.clock = clock
        self.epoch = clock.begin() if clock is not None else 0
        self.step = start
        self.steps = steps
        self.feed = feed
        self.done = False

    def batch(self, data: T) -> T:
        """``data`` is the batch of the next step (emptied when it holds repeats only)."""
        k = self.step
        self.step = k + 1
        weight = 1.0
        if self.steps is not None and k >= self.steps.full:
            weight, empty = self.steps.share(k)
            if empty:
                data = emptied(data)
        feed = self.feed
        if feed is not None:
            feed.weight, feed.epoch, feed.step = weight, self.epoch, k
        return data

    def end(self) -> None:
        if not self.done and self.clock is not None:
            self.clock.finish(self.epoch)
        self.done = True


def emptied(batch: T) -> T:
    """``batch`` with no samples: every tensor cut to 0 rows, every list of plain values emptied."""
    out: object = batch
    if isinstance(batch, torch.Tensor):
        out = batch[:0]
    elif isinstance(batch, Mapping):
        out = {k: emptied(v) for k, v in batch.items()}
    elif isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple: same fields, emptied
        out = type(batch)(*(emptied(v) for v in batch))
    elif isinstance(batch, (list, tuple)):
        nested = batch and all(isinstance(v, (torch.Tensor, Mapping, list, tuple)) for v in batch)
        out = type(batch)(emptied(v) for v in batch) if nested else type(batch)()
    return cast(T, out)


def warn_tail(sampler: _ShardedBase, b: int | None, drop_last: bool, even_batches: bool) -> None:
    """Say which step of each epoch the ranks share unevenly, and what that means for exactness."""
    if b is None or drop_last or sampler.num_replicas == 1:
        return
    steps = Steps(sampler, b, not even_batches)
    tail = steps.tail()
    if len(set(tail)) < 2:
        return
    empty = ""
    if 0 in tail:
        empty = (
            "Ranks without a sample get an empty batch there (every tensor with 0 rows), so that every rank runs "
            "the same steps; a model that cannot take one (BatchNorm in training) needs even_batches=True, which "
            "repeats a sample that carries no gradient weight. "
            if not even_batches
            else "Ranks without a sample repeat one there (even_batches=True), with no gradient weight. "
        )
    warn(
        f"{sampler.length} samples in global batches of {steps.global_batch} leave a last step of "
        f"{_count(sum(tail), 'sample')}, split {', '.join(map(str, tail))} over the {sampler.num_replicas} "
        f"ranks. {empty}auto_model weights each rank's gradient by its share, so a loss that is the mean over "
        "each rank's batch trains exactly like one process; a sum or another reduction, or several loaders "
        "feeding one model, makes that step differ: pass drop_last=True (or a dataset length that divides by "
        f"{steps.global_batch}) to avoid it"
    )


class LoaderState(TypedDict):
    """An ``AutoDataLoader``'s ``state_dict()``."""

    #: the epoch of the pass under way, else of the next pass
    epoch: int
    #: global samples that pass has yielded (steps x global batch)
    samples: int
    #: the global batch they were counted in (None: no automatic batching, or a custom batch_sampler)
    global_batch: int | None


def position(
    clock: EpochClock | None, current: Pass | None, sharded: _ShardedBase | None, unit: int | None
) -> LoaderState:
    """A loader's resumable state: the epoch of the pass under way (else the next one's), the global
    samples that pass has yielded (``unit`` a step), and the global batch they were counted in.

    ``current`` is None once its iterator is gone: a pass left early changes nothing.
    """
    if current is not None and not current.done and current.clock is not None:
        epoch, samples = current.epoch, current.step * (unit or 0)
        if sharded is not None:
            samples = min(samples, sharded.total_size)
    elif sharded is not None:
        epoch, samples = sharded.epoch, sharded.start
    elif clock is not None:
        found = getattr(clock.target, "epoch", None)
        epoch, samples = (found if isinstance(found, int) else clock._next), 0
    else:
        epoch, samples = 0, 0
    return {"epoch": epoch, "samples": samples, "global_batch": unit}


def _count_of(state: Mapping[str, object], key: str, allow_none: bool = False) -> int | None:
    value = state.get(key)
    if value is None and allow_none:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TrainingSetupError(f"a loader's state needs {key!r}: an int >= 0, got {value!r} (state {dict(state)!r})")
    return value


def restore(clock: EpochClock | None, sharded: _ShardedBase | None, unit: int | None, state: object) -> None:
    """Put a loader at ``state`` (``position``'s): the next pass is the saved epoch from the saved sample.

    The saved global batch must be this loader's, else the rest of the epoch would be other
    batches (``TrainingSetupError``, nothing changed).
    """
    if not isinstance(state, Mapping):
        raise TrainingSetupError(f"a loader's state is a mapping (its state_dict()), got {type(state).__name__}")
    st = cast("Mapping[str, object]", state)
    epoch, samples = _count_of(st, "epoch"), _count_of(st, "samples")
    saved = _count_of(st, "global_batch", allow_none=True)
    if saved is not None and unit is not None and saved != unit:
        world = sharded.num_replicas if sharded is not None else 1
        raise TrainingSetupError(
            f"the saved loader state counts samples in a global batch of {saved}, but this loader loads a global "
            f"batch of {unit} ({unit // world} per rank on {world} ranks): the rest of the run would train on other "
            f"batches. Build it with batch_size={saved}, and choose a global batch that divides by every world size "
            "the job may run at"
        )
    if samples and (sharded is None or unit is None or samples % unit):
        raise TrainingSetupError(
            f"the saved loader state is {samples} samples into epoch {epoch}, and this loader cannot start there: "
            "only idist's own sampler (no sampler=, batch_sampler= or IterableDataset) with a batch_size resumes "
            "mid-epoch; save at the end of an epoch instead"
        )
    if sharded is not None:
        sharded.epoch, sharded.start, sharded.epoch_was_set = cast(int, epoch), cast(int, samples), False
    elif clock is not None:
        clock.set_epoch(cast(int, epoch))
    elif epoch:
        raise TrainingSetupError(f"this loader's order does not depend on epochs; it cannot resume epoch {epoch}")
