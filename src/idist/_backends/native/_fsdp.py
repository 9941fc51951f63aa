"""FSDP2 over a ``NativeContext``'s own process group (``auto_model(model, strategy="fsdp")``).

A device mesh is built from the context's process group; ``fully_shard`` is applied to
each submodule the policy picks (deepest first), then to the root. The default policy
picks each child of the root that holds parameters; ``shard_modules=(Block, ...)`` picks
every submodule of those classes instead. Each rank then holds about 1/world_size of the
parameters, gradients and optimizer state.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from ..._errors import TrainingSetupError
from ...training._model import whole
from ._ddp import sync_batchnorm

if TYPE_CHECKING:
    from ._context import NativeContext

logger = logging.getLogger("idist.training")


def units(model: nn.Module, shard_modules: object) -> list[nn.Module]:
    """The submodules to shard before the root, deepest first."""
    if shard_modules is None:
        return [child for child in model.children() if any(True for _ in child.parameters())]
    classes = tuple(shard_modules) if isinstance(shard_modules, (tuple, list)) else (shard_modules,)
    if not classes or not all(isinstance(c, type) and issubclass(c, nn.Module) for c in classes):
        raise TrainingSetupError(f"shard_modules must be a tuple of nn.Module classes, got {shard_modules!r}")
    picked = [m for m in model.modules() if m is not model and isinstance(m, classes)]
    if not picked:
        present = sorted({type(m).__name__ for m in model.modules() if m is not model})
        raise TrainingSetupError(
            f"shard_modules={[c.__name__ for c in classes]} matches no submodule of {type(model).__name__}; "
            f"its submodules are of the classes {present}"
        )
    return picked[::-1]  # pre-order reversed: every module after the modules inside it


def shard(ctx: NativeContext, model: nn.Module, sync_bn: bool, kwargs: dict[str, Any]) -> nn.Module:
    """``fully_shard`` by the policy over the context's group; a world of one keeps the model whole."""
    if ctx.world_size == 1:
        return whole(ctx, model, kwargs)
    group = ctx._state.world.pg  # not ctx.process_group, which wraps a simulated rank's gloo group
    if not isinstance(group, dist.ProcessGroup) or ctx._dcp_group() is None:  # simulated ranks: unregistered
        raise TrainingSetupError(
            "auto_model(strategy='fsdp') needs one process per rank: torch's sharded tensors keep process-wide "
            "state, which simulated ranks in threads share. Test FSDP code with idist.testing's process runner "
            "or idist.spawn"
        )
    policy = kwargs.pop("shard_modules", None)
    if sync_bn:
        model = sync_batchnorm(ctx, model, group)
    mesh = DeviceMesh.from_group(group, device_type=ctx.device.type)
    picked = units(model, policy)
    try:
        for module in picked:
            fully_shard(module, mesh=mesh, **kwargs)
        fully_shard(model, mesh=mesh, **kwargs)
    except TypeError as exc:
        raise TrainingSetupError(
            f"auto_model(strategy='fsdp') passes options to fully_shard, which refused them: {exc}"
        ) from exc
    logger.info(
        "auto_model: FSDP over %d ranks on rank %d (%s): %d units and the root",
        ctx.world_size,
        ctx.rank,
        ctx.device,
        len(picked),
    )
    return model
