"""``no_sync``: accumulate gradients over micro-batches without exchanging them each time.

DDP skips its all_reduce (``DistributedDataParallel.no_sync``); FSDP2 keeps the unsharded
gradients and skips its reduce-scatter (``set_requires_gradient_sync(False)``) until the
backward outside the block, which exchanges everything accumulated. A model that nothing
synchronizes (one process, or XLA, whose optimizer step averages) needs nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .._errors import TrainingSetupError
from ._model import is_sharded

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

    from .._core import ContextCore


@contextmanager
def no_sync(ctx: ContextCore, model: nn.Module, enabled: bool) -> Iterator[None]:
    """See ``DistContext.no_sync``."""
    ctx._check_no_sync()
    if not isinstance(model, nn.Module):
        raise TrainingSetupError(f"no_sync takes the model auto_model returned, got {type(model).__name__}")
    if not enabled:
        yield
    elif isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    elif is_sharded(model):
        sharded = cast("FSDPModule", model)
        sharded.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            sharded.set_requires_gradient_sync(True)
    else:
        yield
