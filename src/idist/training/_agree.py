"""Ranks compare what they are about to exchange before a backend moves model state."""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING

import torch
from torch import nn

from .. import _reports
from .._errors import TrainingSetupError

if TYPE_CHECKING:
    from .._context import DistContext

logger = logging.getLogger("idist.training")


def agree(ctx: DistContext, what: str, mine: object) -> None:
    """``TrainingSetupError`` on every rank alike unless every rank holds the same ``mine`` (plain data,
    compared by its ``repr``; only a digest of it travels, 16 bytes a rank)."""
    seen = ctx.all_gather(hashlib.blake2b(repr(mine).encode(), digest_size=16).hexdigest())
    differ = [r for r, s in enumerate(seen) if s != seen[0]]
    if differ:
        raise TrainingSetupError(
            f"{what} differs between ranks (rank 0 vs {_reports.ranks(differ)}): build the same model and optimizer "
            "on every rank before auto_model / auto_optim"
        )


def unwrapped_state(
    ctx: DistContext, model: nn.Module, backend: str, sync_bn: bool, sync_bn_hint: str, kwargs: dict[str, object]
) -> list[torch.Tensor]:
    """The parameters and buffers a backend without a model wrapper (Horovod, XLA) moves from
    rank 0, once every rank agreed on their names, dtypes and shapes."""
    if sync_bn:
        raise TrainingSetupError(f"sync_bn=True on {backend}: {sync_bn_hint}")
    if kwargs:
        logger.info("auto_model on %s: no wrapper is used, options %s ignored", backend, sorted(kwargs))
    state = model.state_dict(keep_vars=True)
    if ctx.world_size > 1:
        layout = [(name, str(t.dtype), tuple(t.shape)) for name, t in state.items()]
        agree(ctx, "the model's parameters and buffers", layout)
    return list(state.values())
