"""The context stack: which context the module-level functions talk to.

``current()`` is, in order: the innermost context made current by ``context(...)`` or
``use(...)`` in this thread/task (a ``ContextVar``, so simulated ranks in threads never see
each other's); else the process default set by ``initialize()``; else one adopted from an
already initialized torch.distributed / Horovod / XLA runtime; else a ``SerialContext``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

from . import _backends
from ._backends.serial import SerialContext
from ._context import DistContext
from ._detect import detect_backend
from ._errors import AlreadyInitializedError
from .training import _sampler

C = TypeVar("C", bound=DistContext)

_scoped: ContextVar[DistContext | None] = ContextVar("idist_current", default=None)
_lock = threading.Lock()
_default: DistContext | None = None
_adopted: DistContext | None = None
_serial: SerialContext | None = None


def _adopt() -> DistContext | None:
    global _adopted
    adopted = _adopted
    if adopted is not None and not adopted.closed and adopted.still_adopted():
        return adopted
    _adopted = None
    for cls in _backends.adopters():
        # a runtime can only be running once its package is imported: adoption never imports it
        if cls.ADOPTS_FROM in sys.modules:
            ctx = cls.adopt()
            if ctx is not None:
                _adopted = ctx
                return ctx
    return None


def forget_adopted() -> None:
    """Adopt afresh on the next ``current()`` (the runtime, or a hint about it, changed)."""
    global _adopted
    _adopted = None


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
        _serial = SerialContext.create()
    return _serial


def create(backend: str | None, **kwargs: object) -> DistContext:
    return _backends.create(backend if backend is not None else detect_backend(), **kwargs)


def initialize(backend: str | None = None, **kwargs: object) -> DistContext:
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
def use(ctx: C) -> Iterator[C]:
    """Make ``ctx`` current in this thread/task for the block (``with idist.use(ctx) as same:``, typed
    as ``ctx``); does not finalize it."""
    token = _scoped.set(ctx)
    try:
        yield ctx
    finally:
        _scoped.reset(token)


@contextmanager
def scoped(backend: str | None, **kwargs: object) -> Iterator[DistContext]:
    ctx = create(backend, **kwargs)
    try:
        with use(ctx):
            yield ctx
    finally:
        ctx.close()


def _current_topology() -> tuple[int, int]:
    ctx = current()
    return ctx.world_size, ctx.rank


# DistributedProxySampler(sampler) defaults to the current context's world size and rank;
# training/ sits below this layer, so it is told where to look instead of importing it.
_sampler.use_current_topology(_current_topology)
