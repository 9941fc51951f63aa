"""auto_dataloader and its samplers: shares, epochs, RNG, batch sizes, settings read back.

Multi-rank cases run on real in-process gloo contexts (one thread per rank, the core's
``NativeContext.in_process``); the loader only reads the context's topology, so each rank builds
and iterates its own loader exactly as in a real process.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    TensorDataset,
    WeightedRandomSampler,
)

import idist
from idist import TrainingSetupError
from idist.testing import RankFailedError, simulate
from idist.training import AutoDataLoader, DistributedProxySampler, ShardSampler


def on_ranks(world: int, fn: Callable[[idist.DistContext], Any], timeout: float = 60.0) -> list[Any]:
    """fn(ctx) on ``world`` simulated ranks (threads whose groups meet in memory, unchecked, as these
    contexts are in production); results in rank order, a failing rank's own exception raised as it is.

    Not gloo over loopback in threads: its full-mesh connect fails now and then on a loaded machine.
    """
    try:
        return simulate(world, fn, timeout=timeout, checked=False)
    except RankFailedError as exc:
        raise exc.exception from None


def dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def epoch_of(loader: Any) -> list[list[int]]:
    return [batch[0].tolist() for batch in loader]


def flat(batches: list[list[int]]) -> list[int]:
    return [i for b in batches for i in b]


# ------------------------------------------------------------ exactly once
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_each_sample_once_per_epoch_across_ranks(world: int, drop_last: bool, shuffle: bool) -> None:
    for n in [0, 1, 2, 5, 7, 8, 13, 16, 31]:
        for b in [1, 2, 3]:
            shards = [
                list(ShardSampler(dataset(n), num_replicas=world, rank=r, shuffle=shuffle, drop_last=drop_last))
                for r in range(world)
            ]
            seen = [i for s in shards for i in s]
            assert len(seen) == len(set(seen)), (n, b, shards)
            if drop_last:
                assert len(seen) == n - n % world
            else:
                assert sorted(seen) == list(range(n))
            assert [len(s) for s in shards] == [
                len(ShardSampler(dataset(n), num_replicas=world, rank=r, drop_last=drop_last)) for r in range(world)
            ]


@pytest.mark.parametrize("drop_last", [False, True])
def test_loaders_on_two_ranks_cover_the_epoch_once(drop_last: bool) -> None:
    n, global_batch = 23, 4  # 23 = 5 global batches of 4 + a tail of 3

    def run(ctx: idist.DistContext) -> list[list[list[int]]]:
        loader = ctx.auto_dataloader(dataset(n), batch_size=global_batch, shuffle=True, drop_last=drop_last)
        assert loader.global_batch_size == 4 and loader.batch_size == 2
        return [epoch_of(loader) for _ in range(3)]

    with warnings.catch_warnings():  # the warning filters are process-wide: set them around all ranks
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", "23 samples in global batches of 4 leave a last step of 3")
        r0, r1 = on_ranks(2, run)
    for e in range(3):
        seen = flat(r0[e]) + flat(r1[e])
        assert len(seen) == len(set(seen))
        assert sorted(seen) == (sorted(seen) if drop_last else list(range(n)))
        if drop_last:
            assert len(seen) == 20 and len(r0[e]) == len(r1[e]) == 5
        assert len(r0[e]) == len(r1[e])  # the same number of steps on every rank
    assert r0[0] != r0[1] != r0[2]  # reshuffled every epoch, no set_epoch


def test_tail_smaller_than_world_warns_and_even_batches_pads() -> None:
    # 9 samples, global batch 4 on 2 ranks: the last step holds 1 sample; rank 1 gets an empty
    # batch there (or, with even_batches, a repeated sample), so both run 3 batches
    def run(ctx: idist.DistContext) -> tuple[list[list[int]], list[list[int]]]:
        uneven = ctx.auto_dataloader(dataset(9), batch_size=4)
        even = ctx.auto_dataloader(dataset(9), batch_size=4, even_batches=True)
        return epoch_of(uneven), epoch_of(even)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (u0, e0), (u1, e1) = on_ranks(2, run)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 4 and all("last step of 1 sample, split 1, 0" in m for m in messages), messages
    assert sum("empty batch" in m and "even_batches=True" in m for m in messages) == 2
    assert all(w.filename == __file__ for w in caught)  # attributed to the caller's line
    assert len(u0) == len(u1) == 3 and u1[2] == [] and sorted(flat(u0) + flat(u1)) == list(range(9))
    assert len(e0) == len(e1) == 3
    assert sorted(set(flat(e0) + flat(e1))) == list(range(9)) and len(flat(e0) + flat(e1)) == 10


# ---------------------------------------------------------------- epochs
def test_shuffle_differs_between_epochs_and_set_epoch_wins() -> None:
    loader = idist.auto_dataloader(dataset(32), batch_size=32, shuffle=True)
    e0, e1, e2 = (epoch_of(loader)[0] for _ in range(3))
    assert len({tuple(e0), tuple(e1), tuple(e2)}) == 3
    assert loader.epoch == 2
    loader.set_epoch(0)
    assert epoch_of(loader)[0] == e0 and loader.epoch == 0
    assert epoch_of(loader)[0] == e1  # then it advances again
    sampler = loader.sampler
    assert isinstance(sampler, ShardSampler)
    sampler.set_epoch(1)  # on the sampler: also wins
    assert epoch_of(loader)[0] == e1
    sampler.set_epoch(1)  # the same value twice: still explicit, same order
    assert epoch_of(loader)[0] == e1
    # same seed, new loader: the same sequence of epochs (nothing depends on global state)
    again = idist.auto_dataloader(dataset(32), batch_size=32, shuffle=True)
    assert [epoch_of(again)[0] for _ in range(2)] == [e0, e1]
    other_seed = idist.auto_dataloader(dataset(32), batch_size=32, shuffle=True, seed=7)
    assert epoch_of(other_seed)[0] != e0


def test_a_users_distributed_sampler_is_kept_and_advanced() -> None:
    user = DistributedSampler(dataset(16), num_replicas=1, rank=0, shuffle=True)
    loader = idist.auto_dataloader(dataset(16), batch_size=16, sampler=user)
    assert loader.sampler is user
    e0, e1 = epoch_of(loader)[0], epoch_of(loader)[0]
    assert e0 != e1 and user.epoch == 2  # the epoch of the next pass
    user.set_epoch(5)  # changed by hand: honoured
    reference = DistributedSampler(dataset(16), num_replicas=1, rank=0, shuffle=True)
    reference.set_epoch(5)
    assert epoch_of(loader)[0] == list(reference)
    assert epoch_of(loader)[0] != list(reference) and user.epoch == 7  # epoch 6 ran; 7 is next


def test_a_mismatched_distributed_sampler_warns() -> None:
    user = DistributedSampler(dataset(16), num_replicas=4, rank=3)
    with pytest.warns(UserWarning, match=r"num_replicas=4.*rank 0 of 1"):
        loader = idist.auto_dataloader(dataset(16), sampler=user)
    assert loader.sampler is user


# ----------------------------------------------------------- global RNG
def test_global_rngs_untouched_by_sampling_and_loading() -> None:
    torch.manual_seed(123)
    random.seed(123)
    torch_state, py_state = torch.get_rng_state(), random.getstate()
    weights = torch.rand(20)
    torch.manual_seed(123)
    loaders = [
        idist.auto_dataloader(dataset(20), batch_size=4, shuffle=True),
        idist.auto_dataloader(dataset(20), batch_size=4, sampler=RandomSampler(dataset(20))),
        idist.auto_dataloader(dataset(20), batch_size=4, sampler=WeightedRandomSampler(weights, 20)),
        idist.auto_dataloader(DataLoader(dataset(20), batch_size=4, shuffle=True)),
    ]
    for loader in loaders:
        for _ in range(3):
            epoch_of(loader)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert random.getstate() == py_state


def test_a_plain_dataloader_draws_from_the_global_rng() -> None:
    """Why auto_dataloader passes a private generator: torch draws a worker seed per pass."""
    state = torch.get_rng_state()
    epoch_of(DataLoader(dataset(4), batch_size=2))
    assert not torch.equal(torch.get_rng_state(), state)


def test_proxy_sampler_gives_ranks_disjoint_shares_of_one_sequence() -> None:
    weights = torch.linspace(0.1, 1.0, 30)

    def run(ctx: idist.DistContext) -> tuple[list[int], list[int]]:
        sampler = WeightedRandomSampler(weights, 30, replacement=False)
        loader = ctx.auto_dataloader(dataset(30), per_rank_batch_size=5, sampler=sampler)
        assert isinstance(loader.sampler, DistributedProxySampler)
        return flat(epoch_of(loader)), flat(epoch_of(loader))

    ranks = on_ranks(3, run)
    for e in range(2):
        seen = [i for r in ranks for i in r[e]]
        assert sorted(seen) == list(range(30))
    assert ranks[0][0] != ranks[0][1]


def test_proxy_sampler_checks_its_input() -> None:
    class Unsized(torch.utils.data.Sampler[int]):
        def __iter__(self) -> Iterator[int]:
            return iter(range(3))

    with pytest.raises(TrainingSetupError, match=r"must be a torch\.utils\.data\.Sampler"):
        DistributedProxySampler(iter([1, 2]), num_replicas=1, rank=0)  # type: ignore[arg-type]
    with pytest.raises(TrainingSetupError, match="no __len__"):
        DistributedProxySampler(Unsized(), num_replicas=1, rank=0)

    class Endless(torch.utils.data.Sampler[int]):
        def __iter__(self) -> Iterator[int]:
            return iter(range(3))

        def __len__(self) -> int:
            return 5

    with pytest.raises(TrainingSetupError, match="yielded 3 indices but its len"):
        list(DistributedProxySampler(Endless(), num_replicas=1, rank=0))


# ----------------------------------------------------------- batch sizes
def test_global_batch_split_and_the_warning_when_it_does_not_divide() -> None:
    def run(ctx: idist.DistContext) -> tuple[int | None, int | None]:
        loader = ctx.auto_dataloader(dataset(40), batch_size=10)
        return loader.batch_size, loader.global_batch_size

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert on_ranks(3, run) == [(3, 9)] * 3
    messages = [str(w.message) for w in caught if "batch_size=10" in str(w.message)]
    assert len(messages) == 3
    assert all("batch_size=10 is the global batch" in m and "global batch is 9" in m for m in messages)

    def per_rank(ctx: idist.DistContext) -> tuple[int | None, int | None]:
        loader = ctx.auto_dataloader(dataset(40), per_rank_batch_size=4)
        return loader.batch_size, loader.global_batch_size

    assert on_ranks(2, per_rank) == [(4, 8), (4, 8)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 4, "per_rank_batch_size": 2}, "not both"),
        ({"batch_size": 0}, "positive int"),
        ({"per_rank_batch_size": 2.5}, "positive int"),
        ({"num_workers": -1}, "num_workers"),
        ({"sampler": RandomSampler(range(8)), "shuffle": True}, "exclude each other"),
        ({"shard_iterable": True}, "is for an IterableDataset"),
        ({"seed": "x"}, "seed must be an int"),
    ],
)
def test_bad_options_raise_a_typed_error(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(TrainingSetupError, match=match):
        idist.auto_dataloader(dataset(8), **kwargs)


def test_num_workers_is_a_per_node_total() -> None:
    def workers(n: int) -> Callable[[idist.DistContext], int]:
        return lambda ctx: ctx.auto_dataloader(dataset(8), batch_size=2, num_workers=n).num_workers

    assert on_ranks(2, workers(3)) == [2, 2]  # ceil(3 / 2 processes on this node)
    assert on_ranks(2, workers(1)) == [1, 1]  # fewer than the processes: kept per process, as in ignite


def test_pin_memory_follows_the_device_unless_given() -> None:
    assert idist.auto_dataloader(dataset(4)).pin_memory is (idist.device().type == "cuda")
    assert idist.auto_dataloader(dataset(4), pin_memory=False).pin_memory is False


# ------------------------------------------------- a DataLoader as input
def _double(batch: list[tuple[torch.Tensor]]) -> torch.Tensor:
    return torch.stack([b[0] for b in batch]) * 2


def test_a_dataloader_is_read_back_and_kwargs_override() -> None:
    src = DataLoader(dataset(10), batch_size=4, shuffle=True, drop_last=True, collate_fn=_double)
    loader = idist.auto_dataloader(src)
    assert isinstance(loader, AutoDataLoader) and isinstance(loader.sampler, ShardSampler)
    assert loader.sampler.shuffle and loader.drop_last and loader.batch_size == 4
    batches = [b.tolist() for b in loader]
    assert len(batches) == 2 and all(v % 2 == 0 for b in batches for v in b)
    plain = idist.auto_dataloader(DataLoader(dataset(10), batch_size=4), batch_size=5)
    assert [b[0].tolist() for b in plain] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    seeded = DataLoader(dataset(10), batch_size=10, sampler=RandomSampler(dataset(10), generator=torch.Generator()))
    assert isinstance(idist.auto_dataloader(seeded).sampler, ShardSampler)
    weighted = DataLoader(dataset(10), sampler=WeightedRandomSampler(torch.ones(10), 10))
    assert isinstance(idist.auto_dataloader(weighted).sampler, DistributedProxySampler)


# ------------------------------------------------------- iterable datasets
class Stream(IterableDataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


def test_iterable_dataset_sharded_by_rank_when_asked() -> None:
    def run(ctx: idist.DistContext) -> tuple[list[int], list[int]]:
        sharded = ctx.auto_dataloader(Stream(11), batch_size=4, shard_iterable=True)
        unsharded = ctx.auto_dataloader(Stream(11), batch_size=4)
        return [int(i) for b in sharded for i in b], [int(i) for b in unsharded for i in b]

    (s0, u0), (s1, u1) = on_ranks(2, run)
    assert sorted(s0 + s1) == list(range(11)) and not set(s0) & set(s1)
    assert u0 == u1 == list(range(11))  # not asked: each rank gets the whole stream


def test_iterable_dataset_sharded_by_worker_too() -> None:
    loader = idist.auto_dataloader(Stream(10), batch_size=2, shard_iterable=True, num_workers=2)
    seen = sorted(int(i) for b in loader for i in b)
    assert seen == list(range(10))


class NoLen(Dataset[int]):
    def __getitem__(self, i: int) -> int:
        return i


def test_a_dataset_without_len_is_refused() -> None:
    with pytest.raises(TrainingSetupError, match="no __len__"):
        idist.auto_dataloader(NoLen())
