"""``auto_model``: the shared steps, and the single-process wrapper.

``auto_model`` checks the model, never wraps a wrapped one twice, moves it to the
context's device and hands it to the backend's hook: ``ctx._wrap_model`` (``strategy="ddp"``)
or ``ctx._shard_model`` (``"fsdp"``). ``wrap_single_process`` is the default ``_wrap_model``
(serial; DataParallel only as ignite does, on one process that sees several CUDA devices).
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

from .._errors import TrainingSetupError
from ._options import STRATEGIES

if TYPE_CHECKING:
    from .._context import DistContext
    from .._core import ContextCore

logger = logging.getLogger("idist.training")

#: a model wrapped in one of these is returned as it is
WRAPPERS: tuple[type[nn.Module], ...] = (DistributedDataParallel, DataParallel)


def is_sharded(model: object) -> bool:
    """Whether ``fully_shard`` was applied to ``model`` (FSDP2 can only be in use once it is imported)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


def auto_model(
    ctx: DistContext, model: nn.Module, sync_bn: bool, strategy: str, kwargs: dict[str, object]
) -> nn.Module:
    """See ``DistContext.auto_model``."""
    if not isinstance(model, nn.Module):
        raise TrainingSetupError(f"auto_model takes a torch.nn.Module, got {type(model).__name__}")
    if strategy not in STRATEGIES:
        raise TrainingSetupError(
            f"auto_model strategy must be one of {', '.join(map(repr, STRATEGIES))}, got {strategy!r}"
        )
    if isinstance(model, WRAPPERS) or is_sharded(model):
        logger.info("auto_model: %s is already wrapped; returned as it is", type(model).__name__)
        return model
    device = ctx.device
    tensors = [*model.parameters(), *model.buffers()]
    if not all(t.device == device for t in tensors):
        model.to(device)
    if strategy == "fsdp":
        return ctx._shard_model(model, sync_bn, kwargs)
    return ctx._wrap_model(model, sync_bn, kwargs)


def whole(ctx: ContextCore, model: nn.Module, kwargs: dict[str, object]) -> nn.Module:
    """``strategy="fsdp"`` on one process: nothing to shard over, the model stays whole."""
    if kwargs:
        logger.info(
            "auto_model(strategy='fsdp'): one process, the model stays whole; options %s ignored", sorted(kwargs)
        )
    return model


def wrap_single_process(ctx: ContextCore, model: nn.Module, sync_bn: bool, kwargs: dict[str, Any]) -> nn.Module:
    """One process: DataParallel when it sees several CUDA devices (as ignite), else unchanged.

    ``kwargs`` go to ``DataParallel`` as they are (it refuses what it does not take).
    """
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
