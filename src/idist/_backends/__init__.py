"""The backend registry: backend name -> the context class that implements it.

Each backend is a ``DistContext`` subclass in a package of its own (``native``,
``horovod``, ``xla``; ``serial`` is one module). Importing them never imports horovod or
torch_xla: a backend class loads its package on ``create`` and raises
``BackendUnavailableError`` with the install hint when it is missing.
"""

from __future__ import annotations

from .._context import DistContext
from .._errors import BackendUnavailableError, UnknownBackendError
from .horovod import HorovodContext
from .native import NativeContext
from .serial import SerialContext
from .xla import XlaContext

BACKENDS: dict[str, type[DistContext]] = {
    "serial": SerialContext,
    "gloo": NativeContext,
    "nccl": NativeContext,
    "mpi": NativeContext,
    "horovod": HorovodContext,
    "xla-tpu": XlaContext,
}


def context_class(name: object) -> type[DistContext]:
    """The class of backend ``name``, or ``UnknownBackendError`` listing the known ones."""
    cls = BACKENDS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise UnknownBackendError(
            f"unknown backend {name!r}; known backends: {', '.join(BACKENDS)} "
            f"(available here: {', '.join(available()) or 'serial'})"
        )
    return cls


def require(name: object) -> type[DistContext]:
    """The class of backend ``name`` when it can run here; else ``UnknownBackendError`` or
    ``BackendUnavailableError`` saying what is missing."""
    cls = context_class(name)
    assert isinstance(name, str)  # context_class accepted it
    if not cls.is_available(name):
        raise BackendUnavailableError(cls.unavailable_reason(name))
    return cls


def create(name: str, **options: object) -> DistContext:
    """A new context of backend ``name``; the backend checks ``options`` (``TypeError`` for an unknown one)."""
    return context_class(name).create(name, **options)


def available() -> list[str]:
    """Backends that can be selected here, in registry order."""
    return [name for name, cls in BACKENDS.items() if cls.is_available(name)]


def adopters() -> list[type[DistContext]]:
    """The classes that can adopt a runtime the user started, in the order they are tried."""
    return list(dict.fromkeys(cls for cls in BACKENDS.values() if cls.ADOPTS_FROM is not None))
