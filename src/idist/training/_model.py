"""``auto_model``: the shared steps, and the two wrappers backends choose between.

``auto_model`` checks the model, never wraps a wrapped one twice, moves it to the
context's device and hands it to ``ctx._wrap_model`` (the backend's hook).
``wrap_single_process`` is the default hook (serial; DataParallel only as ignite does, on
one process that sees several CUDA devices, and logged); ``wrap_ddp`` is NativeContext's
(DistributedDataParallel over the context's own process group when the world size > 1).
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import PrefixStore
from torch.nn.parallel import DataParallel, DistributedDataParallel

from .._errors import TrainingSetupError

if TYPE_CHECKING:
    from .._backends._native import NativeContext
    from .._context import DistContext

logger = logging.getLogger("idist.training")

#: attribute of a DDP from auto_model holding its group past its Reducer (see wrap_ddp)
KEEPALIVE = "_idist_process_group"

#: a model wrapped in one of these is returned as it is
WRAPPERS: tuple[type[nn.Module], ...] = (DistributedDataParallel, DataParallel)

#: torch ProcessGroups built around the raw gloo group of an in-process (simulated) context
_TORCH_GROUPS: weakref.WeakKeyDictionary[object, dist.ProcessGroup] = weakref.WeakKeyDictionary()


def auto_model(ctx: DistContext, model: nn.Module, sync_bn: bool = False, **kwargs: Any) -> nn.Module:
    """See ``DistContext.auto_model``."""
    if not isinstance(model, nn.Module):
        raise TrainingSetupError(f"auto_model takes a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, WRAPPERS):
        logger.info("auto_model: %s is already wrapped; returned as it is", type(model).__name__)
        return model
    device = ctx.device
    tensors = [*model.parameters(), *model.buffers()]
    if not all(t.device == device for t in tensors):
        model.to(device)
    return ctx._wrap_model(model, sync_bn, dict(kwargs))


def wrap_single_process(ctx: DistContext, model: nn.Module, sync_bn: bool, kwargs: dict[str, Any]) -> nn.Module:
    """One process: DataParallel when it sees several CUDA devices (as ignite), else unchanged."""
    if sync_bn:
        logger.info("auto_model: sync_bn ignored, one process has nothing to synchronize with")
    if ctx.device.type == "cuda" and torch.cuda.device_count() > 1:
        logger.warning(
            "auto_model: one process sees %d CUDA devices, so the model is wrapped in DataParallel (as ignite "
            "does). For DDP, launch one process per device (torchrun / idist.spawn); to use one device, set "
            "CUDA_VISIBLE_DEVICES",
            torch.cuda.device_count(),
        )
        return DataParallel(model, **kwargs)
    if kwargs:
        logger.info("auto_model: no wrapper on one process; options %s ignored", sorted(kwargs))
    return model


def wrap_ddp(ctx: NativeContext, model: nn.Module, sync_bn: bool, kwargs: dict[str, Any]) -> nn.Module:
    """DistributedDataParallel over ``ctx``'s process group (world size > 1), else one process."""
    if ctx.world_size == 1:
        return wrap_single_process(ctx, model, sync_bn, kwargs)
    for key in ("device_ids", "output_device"):
        if key in kwargs:
            where = f"[{ctx.device.index}] from the context's device" if ctx.device.type == "cuda" else "None on CPU"
            raise TrainingSetupError(
                f"auto_model sets {key} itself ({where}); drop {key}={kwargs[key]!r} and pick the device "
                "through the launcher (LOCAL_RANK)"
            )
    group = kwargs.pop("process_group", None) or torch_group(ctx)
    if sync_bn:
        if ctx.device.type == "cpu":
            raise TrainingSetupError(
                "sync_bn=True needs GPU devices: torch's SyncBatchNorm rejects CPU input in training. "
                "On CPU drop sync_bn (each rank then normalizes with its own batch statistics)"
            )
        logger.info("auto_model: converting BatchNorm layers to SyncBatchNorm")
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=group)  # type: ignore[no-untyped-call]
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


def torch_group(ctx: NativeContext) -> dist.ProcessGroup:
    """The torch ``ProcessGroup`` DDP needs: the context's own, or one built around its raw gloo group."""
    pg = ctx.process_group
    if isinstance(pg, dist.ProcessGroup):
        return pg
    group = _TORCH_GROUPS.get(ctx)
    if group is None:
        store = ctx._store
        if store is None:
            raise TrainingSetupError(
                "this context has no store to build a torch ProcessGroup for DDP; create it with idist.initialize"
            )
        prefix = PrefixStore("idist/ddp", store)
        group = dist.ProcessGroup(prefix, ctx.rank, ctx.world_size)
        gloo = dist.ProcessGroup.BackendType.GLOO
        group._register_backend(torch.device("cpu"), gloo, pg)  # type: ignore[arg-type]
        group._set_default_backend(gloo)
        _TORCH_GROUPS[ctx] = group
    return group
