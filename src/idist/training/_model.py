"""``auto_model``: the shared steps, and the single-process wrapper.

``auto_model`` checks the model and its options (against the wrapper's signature, the same on
every backend), never wraps a wrapped one twice, moves it to the context's device and hands it
to the backend's hook: ``ctx._wrap_model`` (``strategy="ddp"``) or ``ctx._shard_model``
(``"fsdp"``); on several ranks the result weighs each batch's gradient by its share of the step
(``_feed``). ``wrap_single_process`` is the default ``_wrap_model`` (serial; DataParallel only
as ignite does, on one process that sees several CUDA devices).
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

from .._errors import TrainingSetupError
from ._feed import weigh_gradients
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
    check_options(ctx.device, strategy, kwargs)
    if isinstance(model, WRAPPERS) or is_sharded(model):
        logger.info("auto_model: %s is already wrapped; returned as it is", type(model).__name__)
        weigh_gradients(ctx, model)  # once: a model auto_model returned has the hook already
        return model
    device = ctx.device
    tensors = [*model.parameters(), *model.buffers()]
    if not all(t.device == device for t in tensors):
        model.to(device)
    wrapped = (
        ctx._shard_model(model, sync_bn, kwargs) if strategy == "fsdp" else ctx._wrap_model(model, sync_bn, kwargs)
    )
    weigh_gradients(ctx, wrapped)
    return wrapped


def _parameters(fn: Callable[..., object], *skip: str) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p not in ("self", "module", *skip)]


def check_options(device: torch.device, strategy: str, kwargs: dict[str, object]) -> None:
    """Refuse what the wrapper does not take, on every backend alike (then ``device_ids`` /
    ``output_device``, which auto_model sets from ``device``, are dropped from ``kwargs``)."""
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard  # deferred: FSDP loads torch.distributed's tensor stack

        valid = ["shard_modules", *_parameters(fully_shard, "mesh")]
        wrapper = "fully_shard"
    else:
        valid, wrapper = _parameters(DistributedDataParallel.__init__), "DistributedDataParallel"
    if strategy == "fsdp" and "mesh" in kwargs:
        raise TrainingSetupError("auto_model builds the device mesh from the context's process group; drop mesh=")
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise TrainingSetupError(
            f"auto_model(strategy={strategy!r}) passes its options to {wrapper}, which takes no "
            f"{', '.join(unknown)}; it takes {', '.join(valid)}"
        )
    cuda = device.type == "cuda"
    right = {"device_ids": [device.index] if cuda else None, "output_device": device.index if cuda else None}
    for key, value in right.items():
        if key in kwargs:
            given = kwargs.pop(key)
            if given != value and not (cuda and key == "output_device" and given == device):
                where = f"{value} from the context's device" if cuda else "None on CPU"
                raise TrainingSetupError(
                    f"auto_model sets {key} itself ({where}); drop {key}={given!r} and pick the device "
                    "through the launcher (LOCAL_RANK)"
                )


def whole(ctx: ContextCore, model: nn.Module, kwargs: dict[str, object]) -> nn.Module:
    """``strategy="fsdp"`` on one process: nothing to shard over, the model stays whole."""
    if kwargs:
        logger.info(
            "auto_model(strategy='fsdp'): one process, the model stays whole; options %s ignored", sorted(kwargs)
        )
    return model


def wrap_single_process(ctx: ContextCore, model: nn.Module, sync_bn: bool, kwargs: dict[str, Any]) -> nn.Module:
    """One process: DataParallel when it sees several CUDA devices (as ignite), else unchanged.

    Of ``kwargs`` (DDP's options, already checked) DataParallel takes ``dim``.
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
        return DataParallel(model, dim=kwargs.get("dim", 0))
    if kwargs:
        logger.info("auto_model: no wrapper on one process; options %s ignored", sorted(kwargs))
    return model
