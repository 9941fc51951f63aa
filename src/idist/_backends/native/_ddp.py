"""DistributedDataParallel over a ``NativeContext``'s own process group (``auto_model``'s hook)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import Backend, PrefixStore
from torch.nn.parallel import DistributedDataParallel

from ..._errors import TrainingSetupError
from ...training._model import wrap_single_process

if TYPE_CHECKING:
    from ._context import NativeContext

logger = logging.getLogger("idist.training")

#: attribute of a DDP from auto_model holding its group past its Reducer (see wrap_ddp)
KEEPALIVE = "_idist_process_group"


def wrap_ddp(ctx: NativeContext, model: nn.Module, sync_bn: bool, kwargs: dict[str, Any]) -> nn.Module:
    """DistributedDataParallel over ``ctx``'s process group (world size > 1), else one process."""
    if ctx.world_size == 1:
        return wrap_single_process(ctx, model, sync_bn, kwargs)
    # device_ids / output_device: checked against the context's device and dropped by auto_model
    group = kwargs.pop("process_group", None) or torch_group(ctx)
    if sync_bn:
        model = sync_batchnorm(ctx, model, group)
    if ctx.device.type == "cuda":
        kwargs["device_ids"] = [ctx.device.index]
    logger.info("auto_model: DistributedDataParallel on rank %d/%d (%s)", ctx.rank, ctx.world_size, ctx.device)
    ddp = DistributedDataParallel(model, process_group=group, **kwargs)
    # Hang at exit otherwise: if the C++ Reducer drops the last reference to a gloo group
    # (model freed after finalize), ~ProcessGroupGloo joins its worker threads while
    # holding the GIL, and a worker that is freeing a finished Work waits for the GIL.
    # An attribute set after ``reducer`` is freed after it, through torch's Python
    # wrapper, whose destructor releases the GIL.
    ddp.__dict__[KEEPALIVE] = group
    return ddp


def sync_batchnorm(ctx: NativeContext, model: nn.Module, group: dist.ProcessGroup) -> nn.Module:
    """``model`` with its BatchNorm layers as SyncBatchNorm over ``group`` (GPU only)."""
    if ctx.device.type == "cpu":
        raise TrainingSetupError(
            "sync_bn=True needs GPU devices: torch's SyncBatchNorm rejects CPU input in training. "
            "On CPU drop sync_bn (each rank then normalizes with its own batch statistics)"
        )
    logger.info("auto_model: converting BatchNorm layers to SyncBatchNorm")
    converted: nn.Module = nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=group)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    return converted


def torch_group(ctx: NativeContext) -> dist.ProcessGroup:
    """``ctx.process_group``: the context's own torch ``ProcessGroup``, or one built around its raw gloo
    group (simulated ranks), which DDP and torch.distributed's functions take."""
    pg = ctx._state.world.pg
    if isinstance(pg, dist.ProcessGroup):
        return pg
    world = ctx._state.world
    group = world.torch_group  # kept on the comm: released with its group
    if group is None:
        store = ctx._store
        if store is None:
            raise TrainingSetupError(
                "this context has no store to build a torch ProcessGroup over; create it with idist.initialize"
            )
        prefix = PrefixStore("idist/ddp", store)
        group = dist.ProcessGroup(prefix, ctx.rank, ctx.world_size)
        gloo = dist.ProcessGroup.BackendType.GLOO
        group._register_backend(torch.device("cpu"), gloo, cast(Backend, pg))  # pg is a ProcessGroupGloo
        group._set_default_backend(gloo)
        world.torch_group = group
    return group
