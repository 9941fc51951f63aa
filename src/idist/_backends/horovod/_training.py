"""auto_model / auto_optim on Horovod: what ``HorovodContext``'s training hooks do.

Horovod has no model wrapper: every rank starts from rank 0's parameters and buffers
(broadcast in place, any dtype), and ``hvd.DistributedOptimizer`` averages the gradients
in ``step()``. Before anything moves, the ranks compare what they are about to exchange
(one gather of names, dtypes and shapes), so a model or optimizer that differs between
ranks raises ``TrainingSetupError`` on every rank instead of leaving Horovod waiting for
a tensor that one rank never sends.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import nn

from ..._errors import TrainingSetupError
from ...training._agree import agree, unwrapped_state
from . import _lib

if TYPE_CHECKING:
    from ...training._options import HorovodOptimizerOptions, OptimOptions
    from ._context import HorovodContext

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)

logger = logging.getLogger("idist.training")

#: idist's names for the ops hvd.DistributedOptimizer can average gradients with
OPTIMIZER_OPS = ("AVERAGE", "SUM", "ADASUM")


def wrap_model(ctx: HorovodContext, model: nn.Module, sync_bn: bool, kwargs: dict[str, object]) -> nn.Module:
    """Rank 0's parameters and buffers on every rank, in place; the model itself returned."""
    hint = (
        "idist does not convert layers for Horovod; replace BatchNorm with hvd.SyncBatchNorm yourself "
        "(GPU only), or drop sync_bn"
    )
    state = unwrapped_state(ctx, model, "Horovod", sync_bn, hint, kwargs)
    if ctx.world_size > 1:
        logger.info("auto_model: broadcasting %d tensors from rank 0 (Horovod)", len(state))
        with torch.no_grad():
            ctx._state.world.broadcast_many([t.data for t in state], 0)
    return model


def wrap_optimizer(ctx: HorovodContext, optimizer: OptimizerT, kwargs: OptimOptions) -> OptimizerT:
    """``hvd.DistributedOptimizer(optimizer, **kwargs)`` starting from rank 0's settings and state.

    ``op`` may be an idist name (``"AVERAGE"``, ``"SUM"``, ``"ADASUM"``) or a Horovod op.
    Hyper-parameters always come from rank 0; the state too when any rank has one (a run
    resumed on rank 0 only), through ``hvd.broadcast_optimizer_state``. A fresh optimizer
    keeps its empty state, so it steps exactly as it would in one process.
    """
    hvd = _lib.hvd
    kw = kwargs.copy()
    op = kw.get("op")
    if isinstance(op, str):
        if op not in OPTIMIZER_OPS:
            raise TrainingSetupError(
                f"auto_optim op={op!r}: Horovod averages gradients with {', '.join(OPTIMIZER_OPS)}"
            )
        kw["op"] = _lib.op_code(op)
    # the other keys as they are; op, now a Horovod code, goes along (a TypedDict may hold more keys)
    forwarded: HorovodOptimizerOptions = kw
    sizes = tuple(len(g["params"]) for g in optimizer.param_groups)
    agree(ctx, "the optimizer's parameter groups", (type(optimizer).__name__, sizes))
    has_state = ctx.all_reduce(bool(optimizer.state), "OR")
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    for group, settings in zip(optimizer.param_groups, ctx.broadcast(hyper if ctx.rank == 0 else None, 0), strict=True):
        group.update(settings)
    try:
        wrapped = hvd.DistributedOptimizer(optimizer, **forwarded)
    except TypeError as exc:
        raise TrainingSetupError(
            f"auto_optim on Horovod passes options to hvd.DistributedOptimizer, which refused them: {exc}"
        ) from exc
    if has_state:
        hvd.broadcast_optimizer_state(wrapped, root_rank=0)
    return wrapped
