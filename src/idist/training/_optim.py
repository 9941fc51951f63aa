"""``auto_optim``: the shared check, then the backend's ``_wrap_optimizer`` hook.

Serial and torch.distributed need nothing (DDP already averages the gradients), so the
default hook returns the optimizer itself; Horovod (DistributedOptimizer plus a state
broadcast) and XLA (``xm.optimizer_step``) override the hook in their contexts. In checked
mode each step first compares where every rank stands in its loaders (``_feed``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypeVar

from torch.optim import Optimizer
from typing_extensions import Unpack

from .._errors import TrainingSetupError
from ._feed import check_places
from ._options import OptimOptions

if TYPE_CHECKING:
    from .._context import DistContext
    from .._core import ContextCore

OptimizerT = TypeVar("OptimizerT", bound=Optimizer)

logger = logging.getLogger("idist.training")


def auto_optim(ctx: DistContext, optimizer: OptimizerT, **kwargs: Unpack[OptimOptions]) -> OptimizerT:
    """See ``DistContext.auto_optim``."""
    if not isinstance(optimizer, Optimizer):
        raise TrainingSetupError(f"auto_optim takes a torch.optim.Optimizer, got {type(optimizer).__name__}")
    wrapped = ctx._wrap_optimizer(optimizer, kwargs)
    check_places(ctx, wrapped)
    return wrapped


def keep_optimizer(ctx: ContextCore, optimizer: OptimizerT, kwargs: OptimOptions) -> OptimizerT:
    """The serial / native hook: the optimizer as it is (options are for other backends)."""
    if kwargs:
        logger.info("auto_optim on %s: options %s are for Horovod/XLA and ignored here", ctx.backend, sorted(kwargs))
    return optimizer
