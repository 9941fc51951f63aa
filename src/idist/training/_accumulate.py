"""``no_sync``: accumulate gradients over micro-batches without exchanging them each time.

DDP skips its all_reduce (``DistributedDataParallel.no_sync``); FSDP2 keeps the unsharded
gradients and skips its reduce-scatter (``set_requires_gradient_sync(False)``) until the
backward outside the block, which exchanges everything accumulated. Either way the end of
a block restores the setting it found, so nested blocks work as DDP's do. A model that nothing
synchronizes (one process, or XLA, whose optimizer step averages) needs nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol, cast

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
        previous = _sync_settings(model)
        cast("FSDPModule", model).set_requires_gradient_sync(False)
        try:
            yield
        finally:
            _restore(model, previous)
    else:
        yield


class _Group(Protocol):
    """FSDP2's ``FSDPParamGroup`` (private): the two flags ``set_requires_gradient_sync`` sets."""

    reduce_grads: bool
    all_reduce_grads: bool


def _sync_settings(model: nn.Module) -> list[tuple[_Group, bool, bool]]:
    """Each FSDP parameter group's gradient-sync settings, to put back as they were (as DDP's
    own ``no_sync`` does): a nested block ends inside the outer one, still without sync.

    FSDP2 has setters but no getter; where its state is not where this looks, an empty list
    (the block then ends with sync on, as before).
    """
    settings: list[tuple[_Group, bool, bool]] = []
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        state = get_state() if callable(get_state) else None
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:  # torch < 2.7: one group per module, or none
            group = getattr(state, "_fsdp_param_group", None)
            groups = [] if group is None else [group]
        for group in groups:
            settings.append((group, bool(group.reduce_grads), bool(group.all_reduce_grads)))
    return settings


def _restore(model: nn.Module, settings: list[tuple[_Group, bool, bool]]) -> None:
    if not settings:
        cast("FSDPModule", model).set_requires_gradient_sync(True)
    for group, reduce_grads, all_reduce_grads in settings:
        group.reduce_grads = reduce_grads
        group.all_reduce_grads = all_reduce_grads
