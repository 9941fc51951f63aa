"""The module-level collectives, rank-only and training helpers: each is ``current().<method>(...)``."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar, overload

import torch
from torch.nn.parallel import DataParallel, DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from typing_extensions import Unpack, deprecated

from . import _rank_only
from ._group import Group
from ._stack import current
from ._types import (
    BoolReduceOp,
    BoolRefusedOp,
    FloatReduceOp,
    FloatValue,
    GroupArg,
    IntReduceOp,
    NoneT,
    ReduceOp,
)
from .training import AutoDataLoader, _settings
from .training._options import AutoDataLoaderOptions, DDPOptions, FSDPOptions, OptimOptions

if TYPE_CHECKING:
    from ._context import DistContext
    from .checkpoint import Loaded

T = TypeVar("T")
TensorT = TypeVar("TensorT", bound=torch.Tensor)
P = ParamSpec("P")
R = TypeVar("R")
M = TypeVar("M", bound=torch.nn.Module)
OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


def _any_backend() -> DistContext[Any]:
    """``current()``, for the module functions, which type-check what any backend takes: the context
    that runs decides (and raises ``TrainingSetupError`` / ``UnsupportedOpError`` for what it cannot do)."""
    return current()


# -------------------------------------------------------------- collectives
@overload
def all_reduce(tensor: TensorT, op: ReduceOp = "SUM", group: GroupArg = None) -> TensorT: ...
@overload
def all_reduce(tensor: bool, op: BoolReduceOp, group: GroupArg = None) -> bool: ...
@overload
@deprecated(
    "all_reduce of a bool takes op AND, OR, MIN or MAX (SUM, PRODUCT and AVERAGE raise "
    "UnsupportedOpError); to count the True values, reduce int(flag)"
)
def all_reduce(tensor: bool, op: BoolRefusedOp = "SUM", group: GroupArg = None) -> bool: ...
@overload
def all_reduce(tensor: int, op: IntReduceOp = "SUM", group: GroupArg = None) -> int: ...
@overload
def all_reduce(tensor: FloatValue, op: FloatReduceOp = "SUM", group: GroupArg = None) -> float: ...
def all_reduce(tensor: Any, op: Any = "SUM", group: GroupArg = None) -> object:
    """``current().all_reduce(tensor, op, group)``; see ``DistContext.all_reduce``."""
    return _any_backend().all_reduce(tensor, op, group)


@overload
def all_gather(tensor: torch.Tensor, group: GroupArg = None) -> list[torch.Tensor]: ...
@overload
def all_gather(tensor: T, group: GroupArg = None) -> list[T]: ...
def all_gather(tensor: T, group: GroupArg = None) -> list[T]:
    """``current().all_gather(tensor, group)``: one entry per rank, in rank order."""
    return current().all_gather(tensor, group)


@overload
def broadcast(tensor: NoneT, src: int = 0, group: GroupArg = None, *, safe_mode: bool = False) -> Any: ...  # pyright: ignore[reportInvalidTypeVarUse]
@overload
def broadcast(
    tensor: torch.Tensor, src: int = 0, group: GroupArg = None, *, safe_mode: bool = False
) -> torch.Tensor: ...
@overload
def broadcast(
    tensor: torch.Tensor | None, src: int = 0, group: GroupArg = None, *, safe_mode: bool = False
) -> torch.Tensor | None: ...
@overload
def broadcast(tensor: T, src: int = 0, group: GroupArg = None, *, safe_mode: bool = False) -> T: ...
def broadcast(tensor: object, src: int = 0, group: GroupArg = None, *, safe_mode: bool = False) -> object:
    """``current().broadcast(tensor, src, group)``: every rank returns ``src``'s value."""
    return current().broadcast(tensor, src, group, safe_mode=safe_mode)


def barrier(group: GroupArg = None) -> None:
    current().barrier(group)


def sync(group: GroupArg = None) -> None:
    current().sync(group)


def new_group(ranks: Sequence[int]) -> Group:
    """A group of these global ranks for ``group=``; ``.rank()`` is -1 outside it."""
    return current().new_group(ranks)


def all_gather_tensors_with_shapes(
    tensor: torch.Tensor, shapes: Sequence[Sequence[int]], group: GroupArg = None
) -> list[torch.Tensor]:
    """``current().all_gather_tensors_with_shapes(tensor, shapes, group)`` (ignite's name)."""
    return current().all_gather_tensors_with_shapes(tensor, shapes, group)


def timeout(seconds: float) -> AbstractContextManager[None]:
    """``with idist.timeout(s):`` bounds each collective in the block (see ``DistContext.timeout``)."""
    return current().timeout(seconds)


def any_rank_failed(failed: bool, group: GroupArg = None) -> bool:
    """True on every rank when ``failed`` is true on any rank."""
    return current().any_rank_failed(failed, group)


# -------------------------------------------------------- rank-only helpers
def one_rank_only(rank: int = 0, with_barrier: bool = True) -> Callable[[Callable[P, R]], Callable[P, R | None]]:
    """Decorator: run on ``rank`` only (the others get None: it returns ``R | None``), then barrier by default.

    The context is looked up when the function is called, not when it is decorated.
    """
    return _rank_only.one_rank_only(current, rank, with_barrier)


def one_rank_first(rank: int = 0, local: bool = False) -> AbstractContextManager[None]:
    """``with idist.one_rank_first():`` rank ``rank`` runs the block before the others."""
    return _rank_only.one_rank_first(current, rank, local)


# --------------------------------------------------------- training helpers
# The module functions take what some backend takes: which one runs is decided when they are called
# (a context's own methods are typed by its backend).
@overload
def auto_model(model: M, sync_bn: bool = False, *, strategy: Literal["fsdp"], **kwargs: Unpack[FSDPOptions]) -> M: ...
@overload
def auto_model(
    model: M, sync_bn: bool = False, *, strategy: Literal["ddp"] = "ddp", **kwargs: Unpack[DDPOptions]
) -> M | DistributedDataParallel | DataParallel[M]: ...
def auto_model(
    model: torch.nn.Module, sync_bn: bool = False, *, strategy: Any = "ddp", **kwargs: Any
) -> torch.nn.Module:
    """``current().auto_model(model, sync_bn, strategy=..., **kwargs)``: on the device, replicated (DDP) or
    sharded (FSDP) when distributed. ``strategy="fsdp"`` on Horovod / XLA raises ``TrainingSetupError``."""
    return _any_backend().auto_model(model, sync_bn, strategy=strategy, **kwargs)


def no_sync(model: torch.nn.Module, enabled: bool = True) -> AbstractContextManager[None]:
    """``with idist.no_sync(model):`` backward passes keep their gradients local (gradient accumulation).

    ``current().no_sync(model, enabled)``; on Horovod it raises ``TrainingSetupError``.
    """
    return _any_backend().no_sync(model, enabled)


def save_checkpoint(path: str | os.PathLike[str], state: Mapping[str, object]) -> None:
    """``current().save_checkpoint(path, state)``: every rank writes its part; published atomically."""
    current().save_checkpoint(path, state)


def load_checkpoint(
    path: str | os.PathLike[str], state: Mapping[str, object], *, strict: bool = True, weights_only: bool = True
) -> Loaded:
    """``current().load_checkpoint(path, state, ...)``: fills modules and optimizers, returns plain values.

    ``weights_only=False`` unpickles anything: only for checkpoints you trust.
    """
    return current().load_checkpoint(path, state, strict=strict, weights_only=weights_only)


def auto_optim(optimizer: OptimizerT, **kwargs: Unpack[OptimOptions]) -> OptimizerT:
    """``current().auto_optim(optimizer, **kwargs)``: unchanged on serial and torch.distributed; on XLA
    any option raises ``TrainingSetupError``."""
    return _any_backend().auto_optim(optimizer, **kwargs)


@overload
def auto_dataloader(
    data: Dataset[T] | DataLoader[T],
    /,
    *,
    dataset: None = None,
    dataloader: None = None,
    **kwargs: Unpack[AutoDataLoaderOptions],
) -> AutoDataLoader[T]: ...
@overload
def auto_dataloader(
    data: None = None, /, *, dataset: Dataset[T], dataloader: None = None, **kwargs: Unpack[AutoDataLoaderOptions]
) -> AutoDataLoader[T]: ...
@overload
def auto_dataloader(
    data: None = None, /, *, dataset: None = None, dataloader: DataLoader[T], **kwargs: Unpack[AutoDataLoaderOptions]
) -> AutoDataLoader[T]: ...
def auto_dataloader(
    data: object = None,
    /,
    *,
    dataset: object = None,
    dataloader: object = None,
    **kwargs: Unpack[AutoDataLoaderOptions],
) -> AutoDataLoader[object]:
    """``current().auto_dataloader(data, **kwargs)``: this rank's share; ``batch_size`` is global.

    The data goes positionally, as ``dataset=`` (ignite's name) or as ``dataloader=`` (a DataLoader).
    """
    return current().auto_dataloader(_settings.the_data(data, dataset, dataloader), **kwargs)
