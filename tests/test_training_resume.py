"""The loader's position in a checkpoint: a resume on another world size continues the global order.

``auto_dataloader``'s loader has ``state_dict()`` / ``load_state_dict()``: the epoch and the global
samples its pass has yielded (and the global batch they were counted in). Put in a checkpoint's
state it is saved as that position, never pickled whole, and restored in place; after a load on
any number of ranks, the global batches go on exactly where the interrupted run left off.
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import Dataset, DistributedSampler

import idist
from idist import CheckpointError, TrainingSetupError
from test_training_loader import on_ranks

N, G = 40, 6  # 40 samples in global batches of 6: the last step holds 4


class Locked(Dataset[int]):
    """A dataset that cannot be pickled (it holds a lock), like one holding open files."""

    def __init__(self, n: int) -> None:
        self.n, self.lock = n, threading.Lock()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def steps(batches: list[list[int]]) -> list[list[int]]:
    return [sorted(b) for b in batches]


def global_steps(per_rank: list[list[list[int]]]) -> list[list[int]]:
    """The global batch of each step: what every rank loaded at that step."""
    return [sorted(i for rank in per_rank for i in rank[k]) for k in range(len(per_rank[0]))]


def make(ctx: idist.DistContext) -> Any:
    return ctx.auto_dataloader(Locked(N), batch_size=G, shuffle=True, seed=7)


def serial_order(epochs: int) -> list[list[int]]:
    with idist.context("serial") as ctx:
        loader = make(ctx)
        return [b.tolist() for _ in range(epochs) for b in loader]


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 1), (1, 2)])
def test_a_resume_on_another_world_size_continues_the_global_order(before: int, after: int) -> None:
    """Epoch 0 whole and 3 steps of epoch 1 on ``before`` ranks; the rest and epoch 2 on ``after``."""

    def first(ctx: idist.DistContext) -> tuple[list[list[int]], dict[str, object]]:
        loader = make(ctx)
        seen = [b.tolist() for b in loader]
        it = iter(loader)
        seen += [next(it).tolist() for _ in range(3)]
        return seen, dict(loader.state_dict())

    def second(ctx: idist.DistContext, state: dict[str, object]) -> tuple[list[list[int]], dict[str, object], int]:
        loader = make(ctx)
        loader.load_state_dict(state)
        remaining = len(loader)
        seen = [b.tolist() for b in loader]  # the rest of epoch 1
        seen += [b.tolist() for b in loader]  # epoch 2
        return seen, dict(loader.state_dict()), remaining

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the uneven last step warns at creation
        a = on_ranks(before, first)
        states = [s for _, s in a]
        assert all(s == states[0] for s in states), states
        assert states[0] == {"epoch": 1, "samples": 3 * G, "global_batch": G}
        b = on_ranks(after, lambda ctx: second(ctx, states[0]))
        expected = steps(serial_order(3))
    got = global_steps([s for s, _ in a]) + global_steps([s for s, _, _ in b])
    assert got == expected
    assert [s for _, s, _ in b] == [{"epoch": 3, "samples": 0, "global_batch": G}] * after
    assert [r for _, _, r in b] == [-(-N // G) - 3] * after  # len() of the resumed pass: its remaining steps


def test_a_checkpoint_holds_the_loaders_position_and_restores_it_in_place(tmp_path: Path) -> None:
    """The dataset (which cannot be pickled) stays out of the checkpoint; the loader in the state resumes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with idist.context("serial") as ctx:
            loader = make(ctx)
            it = iter(loader)
            head = [next(it).tolist() for _ in range(2)]
            ctx.save_checkpoint(tmp_path / "ckpt", {"loader": loader})
            fresh = make(ctx)
            loaded = ctx.load_checkpoint(tmp_path / "ckpt", {"loader": fresh})
            assert dict(loaded) == {}  # nothing pickled as a plain value
            assert fresh.state_dict() == {"epoch": 0, "samples": 2 * G, "global_batch": G}
            rest = [b.tolist() for b in fresh]
            assert fresh.state_dict() == {"epoch": 1, "samples": 0, "global_batch": G}
    assert steps(head + rest) == steps(serial_order(1))


def test_a_different_global_batch_is_refused_at_load(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with idist.context("serial") as ctx:
            loader = make(ctx)
            next(iter(loader))
            ctx.save_checkpoint(tmp_path / "ckpt", {"loader": loader})
            other = ctx.auto_dataloader(Locked(N), batch_size=8, shuffle=True, seed=7)
            with pytest.raises(TrainingSetupError, match=r"global batch of 6.*8"):
                other.load_state_dict(loader.state_dict())
            with pytest.raises(CheckpointError, match=r"global batch of 6.*8"):
                ctx.load_checkpoint(tmp_path / "ckpt", {"loader": other})
            assert other.state_dict() == {"epoch": 0, "samples": 0, "global_batch": 8}  # unchanged


def test_a_global_batch_that_does_not_divide_by_the_world_size_is_refused_at_load() -> None:
    """batch_size=6 on 4 ranks loads 1 each (global 4): resuming a run at 6 there cannot be exact."""
    state = {"epoch": 0, "samples": 12, "global_batch": 6}

    def load(ctx: idist.DistContext) -> None:
        make(ctx).load_state_dict(state)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TrainingSetupError, match=r"global batch of 6.*4 ranks"):
            on_ranks(4, load)


def test_a_position_cannot_be_restored_through_a_foreign_sampler() -> None:
    """A user's DistributedSampler has its own order: the epoch is restored, a mid-epoch position refused."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with idist.context("serial") as ctx:
            ds = Locked(N)
            loader = ctx.auto_dataloader(ds, batch_size=G, sampler=DistributedSampler(ds, num_replicas=1, rank=0))
            loader.load_state_dict({"epoch": 2, "samples": 0, "global_batch": G})
            assert loader.state_dict() == {"epoch": 2, "samples": 0, "global_batch": G}
            with pytest.raises(TrainingSetupError, match="sampler"):
                loader.load_state_dict({"epoch": 2, "samples": G, "global_batch": G})


def test_a_pass_left_early_is_not_a_position() -> None:
    """A look at one batch, or a loop left by ``break``, changes nothing (the next pass repeats the epoch),
    so the state is the start of that epoch; inside a loop it is the loop's position."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with idist.context("serial") as ctx:
            loader = make(ctx)
            next(iter(loader))
            assert loader.state_dict() == {"epoch": 0, "samples": 0, "global_batch": G}
            for k, _ in enumerate(loader):
                assert loader.state_dict() == {"epoch": 0, "samples": (k + 1) * G, "global_batch": G}
                if k == 2:
                    break
            assert loader.state_dict() == {"epoch": 0, "samples": 0, "global_batch": G}
