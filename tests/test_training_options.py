"""auto_dataloader's settings and samplers (issue 32): overriding a loader's settings, the
default batch, sampler keys, numpy's RNG, and the tail of an epoch on several ranks."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler, SequentialSampler

import idist
from idist.training import DistributedProxySampler, ShardSampler
from test_training_loader import dataset, epoch_of, flat, on_ranks


def _double(batch: list[tuple[torch.Tensor]]) -> torch.Tensor:
    return torch.stack([b[0] for b in batch]) * 2


def _init(worker: int) -> None:
    pass


def _busy_loader() -> DataLoader[Any]:
    """A loader with a non-default value for every setting that has one."""
    return DataLoader(
        dataset(12), batch_size=4, shuffle=True, num_workers=2, collate_fn=_double, pin_memory=False,
        drop_last=True, timeout=5.0, worker_init_fn=_init, multiprocessing_context="spawn",
        generator=torch.Generator().manual_seed(3), prefetch_factor=3, persistent_workers=True, in_order=False,
    )  # fmt: skip


OVERRIDES: list[tuple[str, Any]] = [
    ("num_workers", 0),
    ("num_workers", 1),
    ("batch_size", 6),
    ("per_rank_batch_size", 2),
    ("shuffle", False),
    ("sampler", SequentialSampler(range(12))),
    ("batch_sampler", BatchSampler(SequentialSampler(range(12)), 3, False)),
    ("collate_fn", None),
    ("drop_last", False),
    ("timeout", 0.0),
    ("worker_init_fn", None),
    ("multiprocessing_context", "fork"),
    ("generator", torch.Generator()),
    ("prefetch_factor", 5),
    ("persistent_workers", False),
    ("in_order", True),
    ("seed", 9),
]


@pytest.mark.parametrize(("key", "value"), OVERRIDES, ids=[f"{k}={v!r}"[:40] for k, v in OVERRIDES])
def test_any_setting_of_a_passed_loader_can_be_overridden(key: str, value: Any) -> None:
    loader = idist.auto_dataloader(_busy_loader(), **{key: value})
    if key == "num_workers":
        assert loader.num_workers == value
        if value == 0:
            assert loader.timeout == 0 and not loader.persistent_workers and loader.prefetch_factor is None
    elif key in ("batch_size", "per_rank_batch_size"):
        assert loader.batch_size == value
    elif key == "shuffle":
        assert isinstance(loader.sampler, ShardSampler) and not loader.sampler.shuffle
    elif key == "sampler":
        assert isinstance(loader.sampler, DistributedProxySampler)
    elif key == "batch_sampler":
        assert loader.batch_sampler is value
    elif key == "collate_fn":
        assert loader.collate_fn is not _double
    elif key == "multiprocessing_context":
        assert loader.multiprocessing_context is not None
    elif key == "seed":
        assert isinstance(loader.sampler, ShardSampler) and loader.sampler.seed == 9
    else:
        assert getattr(loader, key) == value or getattr(loader, key) is value


def test_turning_workers_off_gives_a_loader_that_runs() -> None:
    loader = idist.auto_dataloader(DataLoader(dataset(6), batch_size=3, num_workers=2), num_workers=0)
    assert epoch_of(loader) == [[0, 1, 2], [3, 4, 5]]


def test_a_batch_size_replaces_a_loaders_batch_sampler() -> None:
    src = DataLoader(dataset(6), batch_sampler=BatchSampler(SequentialSampler(range(6)), 2, False))
    loader = idist.auto_dataloader(src, batch_size=3)
    assert epoch_of(loader) == [[0, 1, 2], [3, 4, 5]]


def test_no_batch_size_warns_like_batch_size_one() -> None:
    def run(ctx: idist.DistContext) -> tuple[int | None, int | None]:
        loader = ctx.auto_dataloader(dataset(4))
        return loader.batch_size, loader.global_batch_size

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert on_ranks(2, run) == [(1, 2)] * 2
    assert len([w for w in caught if "batch_size=1 is the global batch" in str(w.message)]) == 2


# --------------------------------------------------------------------- samplers
class Keyed(Dataset[int]):
    """A dataset indexed by string keys, as a dict is."""

    def __init__(self, n: int) -> None:
        self.data = {f"{i:04d}": i for i in range(n)}

    def __getitem__(self, key: str) -> int:  # type: ignore[override]
        return self.data[key]

    def __len__(self) -> int:
        return len(self.data)


class Keys(Sampler[str]):
    def __init__(self, ds: Keyed) -> None:
        self.keys = list(ds.data)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys)

    def __len__(self) -> int:
        return len(self.keys)


def test_sampler_keys_pass_through_unchanged() -> None:
    ds = Keyed(10)
    loader = idist.auto_dataloader(ds, sampler=Keys(ds), batch_size=5)  # type: ignore[arg-type]
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    proxy = DistributedProxySampler(Keys(ds), num_replicas=2, rank=1)  # type: ignore[arg-type]
    assert list(proxy) == ["0001", "0003", "0005", "0007", "0009"]


class NumpyShuffle(Sampler[int]):
    """A sampler that shuffles with numpy's global RNG."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(np.random.permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


def test_a_sampler_on_numpys_rng_gives_every_rank_one_order() -> None:
    np.random.seed(5)
    before = np.random.get_state()[1].copy()

    def run(ctx: idist.DistContext) -> list[list[int]]:
        np.random.seed(100 + ctx.rank)  # every process has its own numpy state
        # rank threads share numpy's one global state: no rank may reseed it while another draws
        ctx.barrier()
        loader = ctx.auto_dataloader(dataset(8), batch_size=4, sampler=NumpyShuffle(8))
        return [flat(epoch_of(loader)) for _ in range(3)]

    r0, r1 = on_ranks(2, run)
    for e in range(3):
        assert sorted(r0[e] + r1[e]) == list(range(8)), (r0[e], r1[e])
    assert r0[0] != r0[1]
    np.random.seed(5)
    loader = idist.auto_dataloader(dataset(8), batch_size=4, sampler=NumpyShuffle(8))
    epoch_of(loader)
    assert (np.random.get_state()[1] == before).all()  # numpy's global state is left alone


def test_a_proxy_sampler_used_directly_warns_about_an_uneven_tail() -> None:
    with pytest.warns(UserWarning, match=r"even_batches=True"):
        shares = [list(DistributedProxySampler(SequentialSampler(range(9)), num_replicas=2, rank=r)) for r in (0, 1)]
    assert [len(s) for s in shares] == [5, 4]
    even = [
        list(DistributedProxySampler(SequentialSampler(range(9)), num_replicas=2, rank=r, even_batches=True))
        for r in (0, 1)
    ]
    assert [len(s) for s in even] == [5, 5]  # ignite's count


# ------------------------------------------------------------- the epoch's tail
def test_every_rank_runs_as_many_steps_and_each_sample_once() -> None:
    # 9 samples, global batch 4, 2 ranks: the last step holds 1 sample; rank 1 gets an empty batch there
    def run(ctx: idist.DistContext) -> list[list[int]]:
        loader = ctx.auto_dataloader(dataset(9), batch_size=4, shuffle=True)
        assert len(loader) == 3
        return [b[0].tolist() for b in loader]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b0, b1 = on_ranks(2, run)
    assert len(b0) == len(b1) == 3
    assert sorted(flat(b0) + flat(b1)) == list(range(9))
    assert [len(b) for b in b1] == [2, 2, 0]
