"""Type tests for ignite 0.5.5's keyword forms and names: checked by mypy, never executed."""

from __future__ import annotations

from pathlib import Path
from typing import assert_type

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, WeightedRandomSampler

import idist
from idist import AutoDataLoader, Group, HorovodContext, NativeContext, Parallel, XlaContext


def module_collectives_take_tensor(t: torch.Tensor, maybe: float | None) -> None:
    assert_type(idist.all_reduce(tensor=t), torch.Tensor)
    assert_type(idist.all_reduce(tensor=t, op="MAX", group=[0, 1]), torch.Tensor)
    assert_type(idist.all_reduce(tensor=1.5), float)
    assert_type(idist.all_reduce(tensor=3, op="MIN"), int)
    assert_type(idist.all_reduce(tensor=True, op="OR"), bool)
    assert_type(idist.all_gather(tensor=t), list[torch.Tensor])
    assert_type(idist.all_gather(tensor="s"), list[str])
    assert_type(idist.all_gather(tensor=Path("p"), group=[0]), list[Path])
    assert_type(idist.broadcast(tensor=t, src=0), torch.Tensor)
    assert_type(idist.broadcast(tensor=maybe, src=1, safe_mode=True), float | None)
    idist.all_reduce(tensor="text")  # type: ignore[call-overload]
    idist.all_reduce(tensor=t, op="sum")  # type: ignore[call-overload]


def context_collectives_take_tensor(
    ctx: NativeContext, hctx: HorovodContext, xctx: XlaContext, t: torch.Tensor
) -> None:
    assert_type(ctx.all_reduce(tensor=t), torch.Tensor)
    assert_type(ctx.all_reduce(tensor=2, op="MIN"), int)
    assert_type(ctx.all_gather(tensor=t), list[torch.Tensor])
    assert_type(ctx.all_gather(tensor=b"b"), list[bytes])
    assert_type(ctx.broadcast(tensor=t, src=0), torch.Tensor)
    assert_type(hctx.all_reduce(tensor=t, op="ADASUM"), torch.Tensor)
    assert_type(hctx.all_gather(tensor=t), list[torch.Tensor])
    assert_type(xctx.all_gather(tensor=t), list[torch.Tensor])
    assert_type(xctx.all_gather(tensor=1.0), list[float])
    ctx.all_reduce(tensor=t, op="ADASUM")  # type: ignore[call-overload]


def auto_dataloader_takes_dataset_or_dataloader(ds: Dataset[int], dl: DataLoader[int]) -> None:
    assert_type(idist.auto_dataloader(ds, batch_size=8), AutoDataLoader[int])
    assert_type(idist.auto_dataloader(dataset=ds, batch_size=8), AutoDataLoader[int])
    assert_type(idist.auto_dataloader(dataloader=dl), AutoDataLoader[int])
    assert_type(idist.current().auto_dataloader(dataset=ds), AutoDataLoader[int])
    assert_type(idist.current().auto_dataloader(dataloader=dl), AutoDataLoader[int])
    # ignite's usual call: a dataset and DataLoader options
    idist.auto_dataloader(ds, batch_size=32, num_workers=4, shuffle=True, drop_last=True, pin_memory=True)


def ignite_names(t: torch.Tensor, weights: list[float]) -> None:
    assert_type(idist.all_gather_tensors_with_shapes(t, [[2, 3], [3, 4]]), list[torch.Tensor])
    assert_type(idist.all_gather_tensors_with_shapes(t, [(2,), (3,)], group=[0, 1]), list[torch.Tensor])
    assert_type(idist.all_gather_tensors_with_shapes(tensor=t, shapes=[[1]]), list[torch.Tensor])
    idist.set_local_rank(0)
    idist.set_local_rank(index=1)
    idist.set_local_rank("0")  # type: ignore[call-overload]
    g = idist.new_group([0, 1])
    assert_type(g, Group)
    assert_type(g.rank(), int)
    sampler = idist.DistributedProxySampler(WeightedRandomSampler(weights, 10), num_replicas=2, rank=0)
    assert_type(sampler, idist.DistributedProxySampler)
    as_torch: DistributedSampler[int] = sampler
    del as_torch


def parallel_takes_ignite_arguments() -> None:
    Parallel(backend="gloo", nproc_per_node=2, nnodes=None, node_rank=None, master_addr=None, master_port=None)
    Parallel(backend="gloo", nproc_per_node=2, nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port="3344")
    Parallel(backend=None, nproc_per_node=None, nnodes=None, node_rank=None, master_addr=None, master_port=None)
