"""The context stack: which context the module-level functions talk to.

``current()`` is, in order: the innermost context made current by ``context(...)`` or
``use(...)`` in this thread/task (a ``ContextVar``, so simulated ranks in threads never see
each other's); else the process default set by ``initialize()``; else one adopted from an
already initialized torch.distributed / Horovod / XLA runtime; else a ``SerialContext``.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from . import _backends
from ._backends._serial import SerialContext
from ._backends._serial import make as make_serial
from ._context import DistContext
from ._errors import AlreadyInitializedError
from ._launch_env import detect

_scoped: ContextVar[DistContext | None] = ContextVar("idist_current", default=None)
_lock = threading.Lock()
_default: DistContext | None = None
_adopted: DistContext | None = None
#: the adopting backend's ``still_adopted`` (looked up once per adoption, not per call)
_adopted_check: Callable[[DistContext], bool] | None = None
_serial: SerialContext | None = None

#: backend modules that can adopt a runtime the user started, keyed by the package that
#: must already be imported for it to be running (so adoption never imports horovod).
_ADOPTERS = (("torch.distributed", "_native"), ("horovod.torch", "_horovod"), ("torch_xla", "_xla"))


def _adopt() -> DistContext | None:
    global _adopted, _adopted_check
    adopted, check = _adopted, _adopted_check
    if adopted is not None and check is not None and not adopted.closed and check(adopted):
        return adopted
    _adopted = _adopted_check = None
    for package, module in _ADOPTERS:
        if package in sys.modules:
            try:
                mod = __import__(f"idist._backends.{module}", fromlist=["adopt"])
            except ImportError:
                continue
            ctx: DistContext | None = mod.adopt()
            if ctx is not None:
                _adopted, _adopted_check = ctx, getattr(mod, "still_adopted", None)
                return ctx
    return None


def current() -> DistContext:
    """The context the module-level functions use now (see the module docstring)."""
    ctx = _scoped.get()
    if ctx is not None:
        return ctx
    ctx = _default
    if ctx is not None:
        return ctx
    adopted = _adopt()
    if adopted is not None:
        return adopted
    global _serial
    if _serial is None or _serial.closed:
        _serial = make_serial()
    return _serial


#: set by torch_xla.launch / xmp.spawn in the process that runs the replicas (and only there)
XLA_LAUNCHER_VARS = ("PJRT_LOCAL_PROCESS_COUNT",)


def xla_replica() -> bool:
    """Whether torch_xla's launcher started this process's replicas.

    Both must hold: torch_xla is loaded (it was, to run the replicas; checking never imports
    it) and its launcher set ``PJRT_LOCAL_PROCESS_COUNT`` here. ``PJRT_DEVICE`` alone does
    not count: TPU VMs export it for every process, XLA or not.
    """
    return "torch_xla" in sys.modules and all(v in os.environ for v in XLA_LAUNCHER_VARS)


def detect_backend() -> str:
    """The backend ``initialize()`` picks with no name: from the launcher's environment."""
    env = os.environ
    if "HOROVOD_RANK" in env or "HOROVOD_HOSTNAME" in env:
        return "horovod"
    if xla_replica():
        return "xla-tpu"
    if detect(env) is not None:
        import torch

        return "nccl" if torch.cuda.is_available() else "gloo"
    return "serial"


def create(backend: str | None, **kwargs: Any) -> DistContext:
    return _backends.create(backend if backend is not None else detect_backend(), **kwargs)


def initialize(backend: str | None = None, **kwargs: Any) -> DistContext:
    global _default
    with _lock:
        if _default is not None and not _default.closed:
            raise AlreadyInitializedError(
                f"idist is already initialized ({_default.backend}); call idist.finalize() first, "
                "or use `with idist.context(...)` for a scoped context"
            )
        _default = create(backend, **kwargs)
        return _default


def finalize() -> None:
    global _default, _adopted
    with _lock:
        ctx, _default, _adopted = _default, None, None
    if ctx is not None:
        ctx.close()


@contextmanager
def use(ctx: DistContext) -> Iterator[DistContext]:
    """Make ``ctx`` current in this thread/task for the block; does not finalize it."""
    token = _scoped.set(ctx)
    try:
        yield ctx
    finally:
        _scoped.reset(token)


@contextmanager
def scoped(backend: str | None, **kwargs: Any) -> Iterator[DistContext]:
    ctx = create(backend, **kwargs)
    try:
        with use(ctx):
            yield ctx
    finally:
        ctx.close()
