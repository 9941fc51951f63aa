"""Type tests for the training helpers: checked by mypy (strict) and pyright, never executed."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, assert_type

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.nn.parallel import DataParallel, DistributedDataParallel
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    SequentialSampler,
    TensorDataset,
    WeightedRandomSampler,
)

import idist
from idist import AutoDataLoader, DistContext, HorovodContext, NativeContext, SerialContext, XlaContext
from idist.checkpoint import Loaded, Skipped


def helpers_keep_their_types(ctx: NativeContext, ds: TensorDataset) -> None:
    sgd = torch.optim.SGD(nn.Linear(1, 1).parameters())
    assert_type(idist.auto_optim(sgd), torch.optim.SGD)
    assert_type(ctx.auto_optim(torch.optim.Adam([torch.zeros(1)])), torch.optim.Adam)
    assert_type(idist.auto_model(nn.Linear(1, 1)), nn.Linear | DistributedDataParallel | DataParallel[nn.Linear])
    assert_type(ctx.auto_dataloader(ds, batch_size=8), AutoDataLoader[tuple[torch.Tensor, ...]])
    assert_type(idist.auto_dataloader(DataLoader(ds)), AutoDataLoader[tuple[torch.Tensor, ...]])
    loader = idist.auto_dataloader(ds)
    assert_type(loader.global_batch_size, int | None)
    assert_type(loader.epoch, int | None)
    loader.set_epoch(3)
    idist.auto_optim(nn.Linear(1, 1))  # type: ignore[type-var]
    idist.auto_model(sgd)  # type: ignore[call-overload]


def stack(batch: list[tuple[torch.Tensor, ...]]) -> torch.Tensor:
    return torch.stack([t for t, *_ in batch])


def auto_dataloader_takes_dataloader_options_and_its_own(
    ctx: DistContext, ds: TensorDataset, stream: IterableDataset[int], weights: list[float]
) -> None:
    idist.auto_dataloader(ds, batch_size=8, shuffle=True, num_workers=2, pin_memory=True, drop_last=True)
    idist.auto_dataloader(ds, per_rank_batch_size=4, sampler=WeightedRandomSampler(weights, 8), even_batches=True)
    idist.auto_dataloader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), 4, False), seed=3)
    idist.auto_dataloader(ds, collate_fn=stack, worker_init_fn=lambda worker: None, timeout=5.0)
    idist.auto_dataloader(ds, num_workers=2, persistent_workers=True, prefetch_factor=4, multiprocessing_context="fork")
    assert_type(ctx.auto_dataloader(stream, shard_iterable=True, generator=torch.Generator()), AutoDataLoader[int])
    assert_type(
        ctx.auto_dataloader(dataloader=DataLoader(ds), batch_size=None), AutoDataLoader[tuple[torch.Tensor, ...]]
    )
    idist.auto_dataloader(ds, batchsize=8)  # type: ignore[call-overload]
    idist.auto_dataloader(ds, seed="3")  # type: ignore[call-overload]
    idist.auto_dataloader(ds, sampler=[0, 1])  # type: ignore[call-overload]
    ctx.auto_dataloader(dataset=ds, per_rank_batch_size=2.5)  # type: ignore[call-overload]


def fsdp_is_typed_where_the_backend_can_shard(
    n: NativeContext, s: SerialContext, d: DistContext, h: HorovodContext, x: XlaContext, m: nn.Module
) -> None:
    assert_type(n.auto_model(m, strategy="fsdp"), nn.Module)
    n.auto_model(m, strategy="fsdp", reshard_after_forward=False, mp_policy=MixedPrecisionPolicy())
    n.auto_model(m, strategy="fsdp", shard_modules=(nn.Linear,))
    n.auto_model(m, strategy="ddp", find_unused_parameters=True)
    n.auto_model(m, find_unused_parameters=True)
    s.auto_model(m, strategy="fsdp")
    d.auto_model(m, strategy="fsdp")  # type: ignore[arg-type]  # any backend: Horovod and XLA cannot shard
    idist.auto_model(m, strategy="fsdp", reshard_after_forward=True)
    h.auto_model(m)
    x.auto_model(m, find_unused_parameters=True)  # ignored there, as on ignite
    h.auto_model(m, strategy="fsdp")  # type: ignore[call-overload]
    x.auto_model(m, strategy="ddp")
    n.auto_model(m, strategy="zero3")  # type: ignore[call-overload]
    n.auto_model(m, strategy="fsdp", find_unused_parameters=True)  # type: ignore[call-overload]
    idist.auto_model(m, strategy="fsdp", static_graph=True)  # type: ignore[call-overload]


def no_sync_is_typed_where_it_can_skip_the_exchange(
    n: NativeContext, s: SerialContext, x: XlaContext, d: DistContext, h: HorovodContext, m: nn.Module
) -> None:
    assert_type(n.no_sync(m), AbstractContextManager[None])
    with s.no_sync(m, enabled=False), x.no_sync(m), idist.no_sync(m):
        pass
    d.no_sync(m)  # type: ignore[misc]  # any backend: Horovod raises
    h.no_sync(m)  # type: ignore[misc]


def checkpoints_on_every_context(ctx: DistContext, h: HorovodContext, m: nn.Module, opt: torch.optim.Adam) -> None:
    ctx.save_checkpoint("ckpt", {"model": m, "optim": opt, "epoch": 3})
    h.save_checkpoint(Path("ckpt"), {"model": m})
    idist.save_checkpoint(Path("ckpt"), {"model": m})
    loaded = idist.load_checkpoint("ckpt", {"model": m, "optim": opt}, strict=False)
    assert_type(loaded, Loaded)
    assert_type(loaded["epoch"], Any)
    assert_type(loaded.skipped, Skipped)
    assert_type(loaded.skipped.missing, tuple[str, ...])
    assert_type(h.load_checkpoint("ckpt", {"model": m}), Loaded)
    ctx.load_checkpoint("ckpt", {"model": m}, True)  # type: ignore[call-arg]
    idist.save_checkpoint(3, {"model": m})  # type: ignore[arg-type]
