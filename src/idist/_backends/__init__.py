"""Backend registry: one private module per backend, imported on first selection.

Importing idist never imports horovod or torch_xla; ``initialize("horovod")`` imports
``idist._backends._horovod``, whose factory raises ``BackendUnavailableError`` (an
``ImportError``) with the install hint when the package is missing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .._context import DistContext
from .._errors import UnknownBackendError

#: backend name -> module under idist._backends that owns it
MODULES: dict[str, str] = {
    "serial": "_serial",
    "gloo": "_native",
    "nccl": "_native",
    "mpi": "_native",
    "horovod": "_horovod",
    "xla-tpu": "_xla",
}


def load(name: str) -> Any:
    """The backend module that owns ``name`` (imported once, then cached by Python)."""
    mod = MODULES.get(name) if isinstance(name, str) else None
    if mod is None:
        raise UnknownBackendError(
            f"unknown backend {name!r}; known backends: {', '.join(MODULES)} "
            f"(available here: {', '.join(available()) or 'serial'})"
        )
    return importlib.import_module(f"{__name__}.{mod}")


def create(name: str, **kwargs: Any) -> DistContext:
    factory: Callable[..., DistContext] = load(name).create
    return factory(name, **kwargs)


def available() -> list[str]:
    """Backends that can be selected here, in registry order."""
    out = []
    for name in MODULES:
        try:
            if load(name).is_available(name):
                out.append(name)
        except ImportError:
            continue
    return out
