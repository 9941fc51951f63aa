"""auto_model / auto_optim on XLA: what ``XlaContext``'s training hooks do.

- ``auto_model``: the shared helper has moved the model to the XLA device; with several
  replicas every rank then starts from rank 0's parameters and buffers (one exact
  broadcast of all of them, after the ranks agreed on names, dtypes and shapes).
- ``auto_optim``: the same optimizer object whose ``step()`` first averages the gradients
  over the replicas, as ``xm.optimizer_step`` does: ``xm.reduce_gradients`` (lazy, part of
  the step's program) on TPU/GPU; on the multi-thread XLA CPU device, one in-turn
  ``all_reduce`` per gradient dtype (see ``_xla``), so no later graph holds a collective.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import nn

from ..._errors import TrainingSetupError
from ..._frame import tensor_bytes
from ...training._agree import agree, unwrapped_state
from . import _lib

if TYPE_CHECKING:
    from ...training._options import OptimOptions
    from ._context import XlaContext

T = TypeVar("T")
OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)

logger = logging.getLogger("idist.training")

#: attribute set on an optimizer whose step() auto_optim already wrapped
WRAPPED = "_idist_xla_step"


def wrap_model(ctx: XlaContext, model: nn.Module, sync_bn: bool, kwargs: dict[str, object]) -> nn.Module:
    """The model itself, on the XLA device, holding rank 0's parameters and buffers."""
    hint = (
        "idist has no synchronized BatchNorm for XLA; drop sync_bn (each replica normalizes its own batch) "
        "or average the statistics yourself"
    )
    state = unwrapped_state(ctx, model, "XLA", sync_bn, hint, kwargs)
    tensors = [t for t in state if t.numel() > 0]
    if ctx.world_size == 1 or not tensors:
        return model
    with torch.no_grad():
        flat = torch.cat([tensor_bytes(t.detach().cpu()) for t in tensors])
        ctx._broadcast_tensor(flat, 0, ctx._state.world)
        if ctx.rank != 0:
            offset = 0
            for t in tensors:
                n = t.numel() * t.element_size()
                value = flat[offset : offset + n].view(t.dtype).reshape(t.shape)
                t.data.copy_(value.to(t.device))
                offset += n
    logger.info("auto_model: %d tensors from rank 0 on every XLA replica", len(tensors))
    return model


def _reduce_gradients(ctx: XlaContext, optimizer: torch.optim.Optimizer) -> None:
    if ctx.world_size == 1:
        return
    if not ctx.xla.ordered:
        _lib.xm.reduce_gradients(optimizer)
        return
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    # Every rank must run the same collectives: agree on what there is to reduce first.
    agree(ctx, "the optimizer's gradients (dtype, count)", sorted((str(d), len(v)) for d, v in by_dtype.items()))
    for dtype in sorted(by_dtype, key=str):
        group = by_dtype[dtype]
        flat = torch.cat([g.detach().reshape(-1) for g in group])
        ctx.all_reduce(flat, "AVERAGE" if dtype.is_floating_point else "SUM")
        offset = 0
        for g in group:
            n = g.numel()
            g.copy_(flat[offset : offset + n].reshape(g.shape))
            offset += n


def wrap_optimizer(ctx: XlaContext, optimizer: OptimizerT, kwargs: OptimOptions) -> OptimizerT:
    """``optimizer`` itself; its ``step()`` averages the gradients over the replicas first."""
    if kwargs:
        raise TrainingSetupError(f"auto_optim on XLA takes no options, got {sorted(kwargs)}")
    if getattr(optimizer, WRAPPED, False):
        return optimizer
    step: Callable[..., object] = optimizer.step

    @functools.wraps(step)
    def reduced_step(*args: object, **kw: object) -> object:
        _reduce_gradients(ctx, optimizer)
        return step(*args, **kw)

    optimizer.step = reduced_step  # type: ignore[method-assign, assignment]  # this optimizer's step, on purpose
    setattr(optimizer, WRAPPED, True)
    return optimizer
