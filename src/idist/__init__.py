"""idist: one typed, explicit-context API for distributed PyTorch.

Each module-level function is ``current().<method>(...)`` and nothing more; see
``idist.current`` for which context that is.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar, final, overload

import torch
from torch.utils.data import DataLoader, Dataset

from . import _backends, _rank_only, _stack
from ._backends.horovod import HorovodContext
from ._backends.native import NativeContext
from ._backends.native._create import set_local_rank_hint
from ._backends.serial import SerialContext
from ._backends.xla import XlaContext
from ._context import DistContext
from ._errors import (
    AlreadyInitializedError,
    BackendUnavailableError,
    CollectiveInputError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    ContextClosedError,
    IdistError,
    LaunchConfigError,
    LaunchEnvironmentError,
    LaunchError,
    LeaderFailedError,
    PeerLostError,
    ReduceOverflowError,
    TrainingSetupError,
    UnknownBackendError,
    UnsupportedOpError,
    UnsupportedSamplerError,
    UnsupportedValueError,
)
from ._group import Group
from ._stack import current, finalize, use
from ._topology import Topology
from ._types import (
    BackendName,
    GroupArg,
    HorovodBackend,
    HorovodReduceOp,
    ModelName,
    NativeBackend,
    ReduceOp,
    SerialBackend,
    XlaBackend,
)
from .launch import Parallel, SpawnHandle, spawn
from .training import AutoDataLoader, DistributedProxySampler, _dataloader

__version__ = "0.1.0"

T = TypeVar("T")
TensorT = TypeVar("TensorT", bound=torch.Tensor)
F = TypeVar("F", bound=Callable[..., Any])
OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)

__all__ = [
    # contexts
    "DistContext", "HorovodContext", "NativeContext", "SerialContext", "XlaContext",
    "Group", "Topology",
    # setup and the context stack
    "available_backends", "context", "current", "finalize", "has_hvd_support",
    "has_native_dist_support", "has_xla_support", "initialize", "set_local_rank", "show_config", "use",
    # queries
    "backend", "device", "get_local_rank", "get_nnodes", "get_node_rank", "get_nproc_per_node",
    "get_rank", "get_world_size", "hostname", "model_name", "rank", "world_size",
    # collectives
    "all_gather", "all_gather_tensors_with_shapes", "all_reduce", "any_rank_failed", "barrier", "broadcast",
    "new_group", "sync", "timeout",
    # rank-only and training helpers
    "AutoDataLoader", "DistributedProxySampler", "auto_dataloader", "auto_model", "auto_optim",
    "one_rank_first", "one_rank_only",
    # launching
    "Parallel", "SpawnHandle", "spawn",
    # errors
    "AlreadyInitializedError", "BackendUnavailableError", "CollectiveInputError", "CollectiveMismatchError",
    "CollectiveTimeoutError", "ContextClosedError", "IdistError", "LaunchConfigError", "LaunchEnvironmentError",
    "LaunchError", "LeaderFailedError", "PeerLostError", "ReduceOverflowError", "TrainingSetupError",
    "UnknownBackendError", "UnsupportedOpError", "UnsupportedSamplerError", "UnsupportedValueError",
    # type aliases
    "BackendName", "GroupArg", "HorovodBackend", "HorovodReduceOp", "ModelName", "NativeBackend",
    "ReduceOp", "SerialBackend", "XlaBackend",
]  # fmt: skip


# ------------------------------------------------------------------- setup
@overload
def initialize(backend: None = None, **kwargs: Any) -> DistContext: ...
@overload
def initialize(backend: SerialBackend, **kwargs: Any) -> SerialContext: ...
@overload
def initialize(backend: NativeBackend, **kwargs: Any) -> NativeContext: ...
@overload
def initialize(backend: HorovodBackend, **kwargs: Any) -> HorovodContext: ...
@overload
def initialize(backend: XlaBackend, **kwargs: Any) -> XlaContext: ...
def initialize(backend: BackendName | None = None, **kwargs: Any) -> DistContext:
    """Create the process-wide default context and return it.

    With no backend, the launcher's environment decides (torchrun / idist.spawn, SLURM,
    OpenMPI, MPICH, horovodrun); with none present it is a ``SerialContext``. Options:
    ``rank``, ``world_size``, ``init_method``, ``master_addr``, ``master_port``, ``store``,
    ``timeout`` (seconds). Raises ``UnknownBackendError`` (lists the available ones),
    ``BackendUnavailableError``, ``LaunchEnvironmentError`` or ``AlreadyInitializedError``.
    """
    return _stack.initialize(backend, **kwargs)


@overload
def context(backend: None = None, **kwargs: Any) -> AbstractContextManager[DistContext]: ...
@overload
def context(backend: SerialBackend, **kwargs: Any) -> AbstractContextManager[SerialContext]: ...
@overload
def context(backend: NativeBackend, **kwargs: Any) -> AbstractContextManager[NativeContext]: ...
@overload
def context(backend: HorovodBackend, **kwargs: Any) -> AbstractContextManager[HorovodContext]: ...
@overload
def context(backend: XlaBackend, **kwargs: Any) -> AbstractContextManager[XlaContext]: ...
def context(backend: BackendName | None = None, **kwargs: Any) -> AbstractContextManager[DistContext]:
    """``with idist.context("gloo") as ctx:`` creates a context, makes it current for the
    block (in this thread/task only) and finalizes it on exit, also on an exception."""
    return _stack.scoped(backend, **kwargs)


def show_config() -> None:
    """Log the current context's configuration on the ``idist`` logger."""
    current().show_config()


def available_backends() -> tuple[str, ...]:
    """Backends that can be selected on this machine."""
    return tuple(_backends.available())


@final
class _Support:
    """A support probe that is callable (seed) and truthful as a bool (ignite)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self._names = names

    def __call__(self) -> bool:
        return any(_backends.context_class(name).is_available(name) for name in self._names)

    def __bool__(self) -> bool:
        return self()

    def __repr__(self) -> str:
        return f"<support probe for {'/'.join(self._names)}: {self()}>"


has_native_dist_support = _Support(("gloo", "nccl", "mpi"))
has_hvd_support = _Support(("horovod",))
has_xla_support = _Support(("xla-tpu",))


# ------------------------------------------------------------------ queries
def get_rank() -> int:
    return current().rank


def get_world_size() -> int:
    return current().world_size


def get_local_rank() -> int:
    return current().local_rank


def get_node_rank() -> int:
    return current().node_rank


def get_nnodes() -> int:
    return current().nnodes


def get_nproc_per_node() -> int:
    return current().nproc_per_node


rank = get_rank
world_size = get_world_size


def device() -> torch.device:
    return current().device


def backend() -> str | None:
    """The current backend's name; None when serial (as in ignite)."""
    b = current().backend
    return None if b == "serial" else b


def model_name() -> ModelName:
    return current().model_name()


def hostname() -> str:
    return socket.gethostname()


# -------------------------------------------------------------- collectives
@overload
def all_reduce(tensor: TensorT, op: ReduceOp = "SUM", group: GroupArg = None) -> TensorT: ...
@overload
def all_reduce(tensor: bool, op: ReduceOp = "SUM", group: GroupArg = None) -> bool: ...
@overload
def all_reduce(tensor: int, op: ReduceOp = "SUM", group: GroupArg = None) -> int: ...
@overload
def all_reduce(tensor: float, op: ReduceOp = "SUM", group: GroupArg = None) -> float: ...
def all_reduce(tensor: Any, op: ReduceOp = "SUM", group: GroupArg = None) -> Any:
    """``current().all_reduce(tensor, op, group)``; see ``DistContext.all_reduce``."""
    return current().all_reduce(tensor, op, group)


@overload
def all_gather(tensor: torch.Tensor, group: GroupArg = None) -> list[torch.Tensor]: ...
@overload
def all_gather(tensor: T, group: GroupArg = None) -> list[T]: ...
def all_gather(tensor: Any, group: GroupArg = None) -> list[Any]:
    """``current().all_gather(tensor, group)``: one entry per rank, in rank order."""
    return current().all_gather(tensor, group)


@overload
def broadcast(tensor: None, src: int = 0, group: GroupArg = None, *, safe_mode: bool = False) -> Any: ...
@overload
def broadcast(tensor: T | None, src: int = 0, group: GroupArg = None, *, safe_mode: bool = False) -> T: ...
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


def set_local_rank(index: int) -> None:
    """ignite's hint: this process's local rank when idist adopts a torch.distributed group
    you initialized and no launcher variable (``LOCAL_RANK``...) says it.

    Contexts idist creates take the launcher's value; a group adopted earlier is adopted
    again with the hint. Raises ``LaunchConfigError`` for anything but an int >= 0.
    """
    if type(index) is not int or index < 0:
        raise LaunchConfigError(f"set_local_rank takes an int >= 0, got {index!r}")
    set_local_rank_hint(index)
    _stack.forget_adopted()


def timeout(seconds: float) -> AbstractContextManager[None]:
    """``with idist.timeout(s):`` bounds each collective in the block (see ``DistContext.timeout``)."""
    return current().timeout(seconds)


def any_rank_failed(failed: bool, group: GroupArg = None) -> bool:
    """True on every rank when ``failed`` is true on any rank."""
    return current().any_rank_failed(failed, group)


# -------------------------------------------------------- rank-only helpers
def one_rank_only(rank: int = 0, with_barrier: bool = True) -> Callable[[F], F]:
    """Decorator: run on ``rank`` only (others return None), then barrier by default.

    The context is looked up when the function is called, not when it is decorated.
    """
    return _rank_only.one_rank_only(current, rank, with_barrier)


def one_rank_first(rank: int = 0, local: bool = False) -> AbstractContextManager[None]:
    """``with idist.one_rank_first():`` rank ``rank`` runs the block before the others."""
    return _rank_only.one_rank_first(current, rank, local)


# --------------------------------------------------------- training helpers
def auto_model(model: torch.nn.Module, sync_bn: bool = False, **kwargs: Any) -> torch.nn.Module:
    """``current().auto_model(model, sync_bn, **kwargs)``: on the device, DDP when distributed."""
    return current().auto_model(model, sync_bn, **kwargs)


def auto_optim(optimizer: OptimizerT, **kwargs: Any) -> OptimizerT:
    """``current().auto_optim(optimizer, **kwargs)``: unchanged on serial and torch.distributed."""
    return current().auto_optim(optimizer, **kwargs)


@overload
def auto_dataloader(
    data: Dataset[T] | DataLoader[T], /, *, dataset: None = None, dataloader: None = None, **kwargs: Any
) -> AutoDataLoader[T]: ...
@overload
def auto_dataloader(
    data: None = None, /, *, dataset: Dataset[T], dataloader: None = None, **kwargs: Any
) -> AutoDataLoader[T]: ...
@overload
def auto_dataloader(
    data: None = None, /, *, dataset: None = None, dataloader: DataLoader[T], **kwargs: Any
) -> AutoDataLoader[T]: ...
def auto_dataloader(
    data: object = None, /, *, dataset: object = None, dataloader: object = None, **kwargs: Any
) -> AutoDataLoader[Any]:
    """``current().auto_dataloader(data, **kwargs)``: this rank's share; ``batch_size`` is global.

    The data goes positionally, as ``dataset=`` (ignite) or as ``dataloader=`` (the seed).
    """
    return current().auto_dataloader(_dataloader.the_data(data, dataset, dataloader), **kwargs)
