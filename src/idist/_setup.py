"""The module-level setup functions and queries: each is ``current().<method>()`` or a lookup."""

from __future__ import annotations

import socket
from contextlib import AbstractContextManager
from typing import cast, final, overload

import torch
from typing_extensions import Unpack, deprecated

from . import _backends, _stack
from ._backends.horovod import HorovodContext
from ._backends.native import NativeContext
from ._backends.native._adopt import set_local_rank_hint
from ._backends.serial import SerialContext
from ._backends.xla import XlaContext
from ._context import DistContext
from ._errors import LaunchConfigError
from ._stack import current
from ._types import (
    BackendName,
    HorovodBackend,
    HorovodOptions,
    ModelName,
    NativeBackend,
    NativeOptions,
    SerialBackend,
    XlaBackend,
    XlaOptions,
)


# ------------------------------------------------------------------- setup
# A backend named by a literal gives its context class and takes that backend's options. Without one,
# or with a name only known when the code runs (a str), the backend may be serial, which takes no
# options: so none type-check there, and the context is a bare DistContext (the calls every backend takes).
@overload
def initialize(backend: None = None) -> DistContext: ...
@overload
def initialize(backend: SerialBackend) -> SerialContext: ...
@overload
def initialize(backend: NativeBackend, **kwargs: Unpack[NativeOptions]) -> NativeContext: ...
@overload
def initialize(backend: HorovodBackend, **kwargs: Unpack[HorovodOptions]) -> HorovodContext: ...
@overload
def initialize(backend: XlaBackend, **kwargs: Unpack[XlaOptions]) -> XlaContext: ...
@overload
def initialize(backend: str) -> DistContext: ...
def initialize(backend: str | None = None, **kwargs: object) -> DistContext:
    """Create the process-wide default context and return it.

    With no backend, the launcher's environment decides (torchrun / idist.spawn, SLURM,
    OpenMPI, MPICH, horovodrun); with none present it is a ``SerialContext``. Options:
    ``rank``, ``world_size``, ``init_method``, ``master_addr``, ``master_port``, ``store``,
    ``timeout`` (seconds), ``checked`` and ``liveness`` for torch.distributed, ``timeout`` for
    Horovod and XLA, none for serial (so none without a backend name); an option the backend does
    not take raises ``TypeError``. Raises ``UnknownBackendError`` (lists the available ones),
    ``BackendUnavailableError``, ``LaunchEnvironmentError`` or ``AlreadyInitializedError``.
    """
    return _stack.initialize(backend, **kwargs)


@overload
def context(backend: None = None) -> AbstractContextManager[DistContext]: ...
@overload
def context(backend: SerialBackend) -> AbstractContextManager[SerialContext]: ...
@overload
def context(backend: NativeBackend, **kwargs: Unpack[NativeOptions]) -> AbstractContextManager[NativeContext]: ...
@overload
def context(backend: HorovodBackend, **kwargs: Unpack[HorovodOptions]) -> AbstractContextManager[HorovodContext]: ...
@overload
def context(backend: XlaBackend, **kwargs: Unpack[XlaOptions]) -> AbstractContextManager[XlaContext]: ...
@overload
def context(backend: str) -> AbstractContextManager[DistContext]: ...
def context(backend: str | None = None, **kwargs: object) -> AbstractContextManager[DistContext]:
    """``with idist.context("gloo") as ctx:`` creates a context, makes it current for the
    block (in this thread/task only) and finalizes it on exit, also on an exception.
    Backends and options as ``initialize``'s."""
    return _stack.scoped(backend, **kwargs)


def show_config() -> None:
    """Log the current context's configuration on the ``idist`` logger."""
    current().show_config()


def available_backends() -> tuple[BackendName, ...]:
    """Backends that can be selected on this machine."""
    return cast("tuple[BackendName, ...]", tuple(_backends.available()))  # the registry's keys are these names


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


@overload
@deprecated("set_local_rank takes an int >= 0: a bool raises LaunchConfigError")
def set_local_rank(index: bool) -> None: ...
@overload
def set_local_rank(index: int) -> None: ...
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
