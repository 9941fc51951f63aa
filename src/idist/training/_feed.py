"""What the batch a rank last loaded weighs, shared by a context's loaders and its model.

An ``AutoDataLoader`` writes, for each batch it yields, the batch's place (epoch, step) and
its weight: ``W * mine / step`` (this rank's real samples over the step's, W ranks), 1 on
every full step. ``auto_model`` multiplies the gradient flowing back into the model's
outputs by that weight, so that DDP's or FSDP's average of the ranks' mean losses is the
mean over the step's samples, as on one process: no communication, and nothing to do while
the weight is 1. In checked mode ``auto_optim`` compares every rank's place before a step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, cast, final

import torch
from torch import nn

from .. import _reports
from .._errors import TrainingSetupError

if TYPE_CHECKING:
    from torch.optim import Optimizer

    from .._context import DistContext
    from .._core import ContextCore

#: set on a model or optimizer that already has idist's hook
HOOKED = "_idist_feed_hook"
#: ``Tensor.register_hook``, which torch leaves unannotated
_register_hook = cast(
    "Callable[[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]], object]", torch.Tensor.register_hook
)


@final
class Feed:
    """The weight and place of the batch this rank's loaders yielded last."""

    __slots__ = ("epoch", "step", "weight")

    def __init__(self) -> None:
        self.weight = 1.0
        self.epoch: int | None = None
        self.step: int | None = None


def feed_of(ctx: ContextCore) -> Feed | None:
    """The context's feed (None on one process: every weight is 1 there)."""
    if ctx.topology.world_size == 1:
        return None
    state = ctx._state
    if state.feed is None:
        state.feed = Feed()
    return state.feed


def _scale(weight: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def hook(grad: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(grad) if weight == 0 else grad * weight

    return hook


def _outputs(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.requires_grad else []
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _outputs(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _outputs(v)]
    return []


def weigh_gradients(ctx: ContextCore, model: nn.Module) -> None:
    """Scale the gradient into ``model``'s outputs by the weight of the batch last loaded."""
    feed = feed_of(ctx)
    if feed is None or getattr(model, HOOKED, False):
        return

    def after_forward(module: nn.Module, args: object, output: object) -> None:
        weight = feed.weight
        if weight != 1.0 and torch.is_grad_enabled():
            for t in _outputs(output):
                _register_hook(t, _scale(weight))

    model.register_forward_hook(after_forward)
    model.__dict__[HOOKED] = True


def check_places(ctx: DistContext, optimizer: Optimizer) -> None:
    """Checked mode: before each step, every rank must stand at the same (epoch, step) of its loaders."""
    feed = feed_of(ctx)
    if feed is None or not ctx.checked or getattr(optimizer, HOOKED, False):
        return

    def before_step(opt: Optimizer, args: object, kwargs: object) -> None:
        places = ctx.all_gather(f"{feed.epoch}:{feed.step}")
        if len(set(places)) > 1:
            at: dict[str, list[int]] = {}
            for r, p in enumerate(places):
                at.setdefault(p, []).append(r)
            table = "; ".join(
                f"{_reports.ranks(ranks)} at epoch {p.replace(':', ' step ')}"
                for p, ranks in list(at.items())[: _reports.MESSAGES]
            )
            if len(at) > _reports.MESSAGES:
                table += f"; and {sum(len(r) for r in list(at.values())[_reports.MESSAGES :])} more ranks elsewhere"
            raise TrainingSetupError(
                f"the ranks step on different batches ({table}): a rank took a pass over a loader the others "
                "did not, so its epoch moved on alone. Take every pass on every rank, or call "
                "loader.set_epoch(epoch) before each epoch"
            )

    optimizer.register_step_pre_hook(before_step)
    setattr(optimizer, HOOKED, True)
