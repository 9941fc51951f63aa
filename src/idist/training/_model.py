"""``auto_model``: the shared steps, and the single-process wrapper.

``auto_model`` checks the model, never wraps a wrapped one twice, moves it to the
context's device and hands it to ``ctx._wrap_model`` (the backend's hook).
``wrap_single_process`` is the default hook (serial; DataParallel only as ignite does, on
one process that sees several CUDA devices, and logged).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

from .._errors import TrainingSetupError

if TYPE_CHECKING:
    from .._context import DistContext
    from .._core import ContextCore

logger = logging.getLogger("idist.training")

#: a model wrapped in one of these is returned as it is
WRAPPERS: tuple[type[nn.Module], ...] = (DistributedDataParallel, DataParallel)


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


def wrap_single_process(ctx: ContextCore, model: nn.Module, sync_bn: bool, kwargs: dict[str, Any]) -> nn.Module:
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
