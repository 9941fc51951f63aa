"""The epoch clock of auto_dataloader (issue 32): only passes that run to their end advance the epoch.

A look at one batch (``next(iter(loader))``) or a pass left early changes nothing; an explicit
``set_epoch`` always wins; ignite's ``update_dataloader`` / ``DeterministicEngine`` rebuild the
loader and keep its clock. Multi-rank cases run on in-process gloo ranks (``on_ranks``).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, WeightedRandomSampler

import idist
from idist.training import AutoDataLoader, DistributedProxySampler, ShardSampler
from test_training_loader import dataset, epoch_of, flat, on_ranks


def test_a_look_at_one_batch_on_one_rank_changes_nothing() -> None:
    def run(ctx: idist.DistContext) -> list[list[int]]:
        loader = ctx.auto_dataloader(dataset(8), batch_size=4, shuffle=True)
        if ctx.rank == 0:
            next(iter(loader))  # log an example
        return [flat(epoch_of(loader)) for _ in range(3)]

    r0, r1 = on_ranks(2, run)
    for e in range(3):
        assert sorted(r0[e] + r1[e]) == list(range(8)), (e, r0[e], r1[e])
    assert r0[0] != r0[1]  # still reshuffled, epoch by epoch


def test_only_a_pass_that_runs_to_its_end_advances_the_epoch() -> None:
    loader = idist.auto_dataloader(dataset(12), batch_size=3, shuffle=True)
    first = epoch_of(loader)
    assert loader.epoch == 0
    it = iter(loader)
    next(it)
    next(it)  # left early
    assert epoch_of(loader) != first  # epoch 1: the partial pass did not count
    assert loader.epoch == 1
    for _ in zip(range(2), loader, strict=False):  # a loop left by break: same epoch again next time
        pass
    again = epoch_of(loader)
    assert loader.epoch == 2 and again != first
    reference = idist.auto_dataloader(dataset(12), batch_size=3, shuffle=True)
    assert [epoch_of(reference) for _ in range(3)][2] == again


def test_a_look_during_a_pass_does_not_disturb_it() -> None:
    loader = idist.auto_dataloader(dataset(9), batch_size=3, shuffle=True)
    reference = idist.auto_dataloader(dataset(9), batch_size=3, shuffle=True)
    got: list[list[list[int]]] = []
    for _ in range(2):
        batches = []
        for i, (x,) in enumerate(loader):
            if i == 1:
                next(iter(loader))
            batches.append(x.tolist())
        got.append(batches)
    assert got == [epoch_of(reference), epoch_of(reference)]


@pytest.mark.parametrize("how", ["distributed", "shard", "proxy", "loader"])
def test_an_explicit_set_epoch_before_each_pass_always_wins(how: str) -> None:
    ds = dataset(16)
    if how == "distributed":
        user = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True)
        loader = idist.auto_dataloader(ds, batch_size=16, sampler=user)
    elif how == "proxy":
        loader = idist.auto_dataloader(ds, batch_size=16, sampler=WeightedRandomSampler(torch.ones(16), 16))
    else:
        loader = idist.auto_dataloader(ds, batch_size=16, shuffle=True)
    orders = []
    for _ in range(4):
        if how == "loader":
            loader.set_epoch(0)
        else:
            loader.sampler.set_epoch(0)  # type: ignore[attr-defined]
        orders.append(epoch_of(loader)[0])
        assert loader.epoch == 0
    assert all(o == orders[0] for o in orders), orders
    assert epoch_of(loader)[0] != orders[0]  # not set: the clock goes on from 0 + 1


def test_set_epoch_during_a_pass_wins_over_that_pass_ending() -> None:
    """ignite sets the epoch at EPOCH_STARTED, before the previous pass's iterator ends."""
    loader = idist.auto_dataloader(dataset(8), batch_size=4, shuffle=True)
    reference = DataLoader(
        dataset(8), batch_size=4, sampler=ShardSampler(dataset(8), num_replicas=1, rank=0, shuffle=True)
    )
    it = iter(loader)
    list(zip(range(2), it, strict=False))
    loader.set_epoch(5)
    assert next(it, None) is None  # the pass of epoch 0 ends now
    reference.sampler.set_epoch(5)  # type: ignore[attr-defined]
    assert epoch_of(loader) == epoch_of(reference)


# ---------------------------------------------------------------- ignite interop
def test_ignite_update_dataloader_rebuilds_an_auto_dataloader() -> None:
    from ignite.engine.deterministic import ReproducibleBatchSampler, update_dataloader

    def run(ctx: idist.DistContext) -> tuple[list[list[int]], bool, int | None]:
        loader = ctx.auto_dataloader(dataset(12), batch_size=4, shuffle=True, drop_last=True)
        rebuilt = update_dataloader(loader, ReproducibleBatchSampler(loader.batch_sampler))  # type: ignore[arg-type]
        assert isinstance(rebuilt, AutoDataLoader)
        passes = [flat(epoch_of(rebuilt)) for _ in range(2)]
        rebuilt.batch_sampler.start_iteration = 1  # type: ignore[union-attr]  # ignite's resume
        resumed = flat(epoch_of(rebuilt))
        reference = ctx.auto_dataloader(dataset(12), batch_size=4, shuffle=True, drop_last=True)
        reference.set_epoch(2)
        return passes, resumed == flat(epoch_of(reference)[1:]), rebuilt.global_batch_size

    r0, r1 = on_ranks(2, run)
    assert r0[1:] == r1[1:] == (True, 4)  # resumed at step 1 of epoch 2
    for e in range(2):
        assert sorted(r0[0][e] + r1[0][e]) == list(range(12))
    assert r0[0][0] != r0[0][1]  # the rebuilt loader keeps the epoch clock


def test_ignite_deterministic_engine_runs_an_auto_dataloader() -> None:
    from ignite.engine import DeterministicEngine, Events

    def run(ctx: idist.DistContext) -> list[list[int]]:
        loader = ctx.auto_dataloader(dataset(10), batch_size=4, shuffle=True)
        seen: list[list[int]] = []
        engine = DeterministicEngine(lambda e, batch: seen.append(batch[0].tolist()))

        @engine.on(Events.EPOCH_STARTED)
        def _set_epoch(e: Any) -> None:  # ignite's distrib_set_epoch handler
            loader.sampler.set_epoch(e.state.epoch - 1)  # type: ignore[attr-defined]

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ignite warns that CUDA determinism flags are unused
            engine.run(loader, max_epochs=3)
        return [i for b in seen for i in b]

    r0, r1 = on_ranks(2, run)
    serial = run(idist.current())
    for e in range(3):
        union = sorted(r0[5 * e : 5 * (e + 1)] + r1[5 * e : 5 * (e + 1)])
        assert union == sorted(serial[10 * e : 10 * (e + 1)])
    assert serial[:10] != serial[10:20]


# ---------------------------------------------------------------- idempotent wrapping
def test_wrapping_an_auto_dataloader_again_keeps_its_global_batch() -> None:
    def run(ctx: idist.DistContext) -> tuple[bool, int | None, int | None, int | None]:
        loader = ctx.auto_dataloader(dataset(16), batch_size=8, shuffle=True)
        again = ctx.auto_dataloader(loader)
        changed = ctx.auto_dataloader(loader, drop_last=True)
        return again is loader, again.global_batch_size, changed.global_batch_size, changed.batch_size

    assert on_ranks(2, run) == [(True, 8, 8, 4)] * 2


def test_a_proxy_sampler_keeps_its_epoch_in_the_sampler() -> None:
    loader = idist.auto_dataloader(dataset(10), batch_size=5, sampler=WeightedRandomSampler(torch.ones(10), 10))
    assert isinstance(loader.sampler, DistributedProxySampler)
    epoch_of(loader)
    assert loader.sampler.epoch == 1  # the next pass's epoch, where a user's set_epoch overwrites it


def test_persistent_workers_keep_the_rule() -> None:
    def run(ctx: idist.DistContext) -> list[list[int]]:
        workers: dict[str, Any] = {"num_workers": 1, "persistent_workers": True, "multiprocessing_context": "fork"}
        loader = ctx.auto_dataloader(dataset(9), batch_size=4, shuffle=True, **workers)
        if ctx.rank == 1:
            next(iter(loader))
        return [[len(b[0]) for b in loader] + flat([b[0].tolist() for b in loader]) for _ in range(1)]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (r0,), (r1,) = on_ranks(2, run)
    # each entry: the batch sizes of one pass, then the samples of the next pass
    assert r0[:3] == [2, 2, 1] and r1[:3] == [2, 2, 0]  # rank 1's last batch is empty
    assert sorted(r0[3:] + r1[3:]) == list(range(9))
