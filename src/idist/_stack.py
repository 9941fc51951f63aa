"""The context stack: which context the module-level functions talk to.

``current()`` is, in order: the innermost context made current by ``context(...)`` or
``use(...)`` in this thread/task (a ``ContextVar``, so simulated ranks in threads never see
each other's); else the simulated rank this thread works for (``in_rank``: a rank thread of
``idist.testing``, or a thread it started); else the process default set by ``initialize()``;
else one adopted from an already initialized torch.distributed / Horovod / XLA runtime; else
a ``SerialContext``. While a simulated run is active, a thread that belongs to no rank gets
``ThreadContextError`` instead of a process-wide answer that would be another rank's or none.
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
from ._errors import AlreadyInitializedError, ThreadContextError
from .training import _sampler

C = TypeVar("C", bound=DistContext)

_scoped: ContextVar[DistContext | None] = ContextVar("idist_current", default=None)
#: the simulated rank whose "process" this thread is part of (see ``in_rank``)
_rank: ContextVar[DistContext | None] = ContextVar("idist_simulated_rank", default=None)
#: simulated runs in progress (``simulated_run``)
_runs = 0
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
    ctx = _rank.get()
    if ctx is not None:
        return ctx
    if _runs:
        raise ThreadContextError(
            f"idist was called from thread {threading.current_thread().name!r}, which no simulated rank started, "
            "while a simulated run is active: its rank cannot be known. Start the thread (or the pool) inside "
            "the rank's function, or pass the rank's context to it and call ctx.<method>(...)"
        )
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
    rank = _rank.get()
    if rank is not None:
        raise AlreadyInitializedError(
            f"idist.initialize() inside a simulated rank: rank {rank.rank} of {rank.world_size} already has its "
            "context, the process default of its simulated process. Use the context passed to your function "
            "(or idist.current()); an initialize() here would make a second, process-wide one"
        )
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
    if _rank.get() is not None:
        return  # a simulated rank's context is its runner's to close; the test process's default is not the rank's
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
def in_rank(ctx: DistContext) -> Iterator[DistContext]:
    """Make ``ctx`` this thread's simulated rank for the block (the rank's process default)."""
    token = _rank.set(ctx)
    try:
        yield ctx
    finally:
        _rank.reset(token)


def rank_of_thread() -> DistContext | None:
    """The simulated rank this thread works for, if any (what a thread it starts inherits)."""
    return _rank.get()


@contextmanager
def simulated_run() -> Iterator[None]:
    """Mark a simulated run as active for the block (see ``current``)."""
    global _runs
    with _lock:
        _runs += 1
    try:
        yield
    finally:
        with _lock:
            _runs -= 1


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
