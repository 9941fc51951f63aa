"""Threads a simulated rank starts work for that rank, as the threads of its process would.

While a simulated world exists, ``threading.Thread.start`` notes the rank of the thread that
calls it, and the new thread runs as part of that rank (``idist.current()`` there is the
rank's context); ``ThreadPoolExecutor.submit`` does the same for each task, so a pool that
ranks share runs each task for the rank that submitted it. Outside a rank both do exactly
what they did; the hooks are removed when the last world closes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .. import _stack
from .._context import DistContext

_lock = threading.Lock()
_users = 0
#: what ``Thread.start`` and ``ThreadPoolExecutor.submit`` were when the hooks went in
_start: Callable[[threading.Thread], None] = threading.Thread.start
_submit: Callable[..., Future[Any]] = ThreadPoolExecutor.submit


def _in_rank(ctx: DistContext, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    with _stack.in_rank(ctx):
        return fn(*args, **kwargs)


def _start_in_rank(self: threading.Thread) -> None:
    ctx = _stack.rank_of_thread()
    if ctx is not None:
        run = self.run

        def run_in_rank() -> None:
            try:
                _in_rank(ctx, run)
            finally:
                self.__dict__.pop("run", None)  # the thread, its run and this closure: no cycle left

        self.__dict__["run"] = run_in_rank  # an instance attribute shadows the method
    _start(self)


def _submit_in_rank(self: ThreadPoolExecutor, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
    ctx = _stack.rank_of_thread()
    if ctx is None:
        return _submit(self, fn, *args, **kwargs)
    return _submit(self, _in_rank, ctx, fn, *args, **kwargs)


_HOOKS: tuple[tuple[type, str, object], ...] = (
    (threading.Thread, "start", _start_in_rank),
    (ThreadPoolExecutor, "submit", _submit_in_rank),
)


def acquire() -> None:
    """A world starts: threads started (and tasks submitted) by its ranks inherit their rank."""
    global _users, _start, _submit
    with _lock:
        _users += 1
        if _users == 1:
            _start, _submit = threading.Thread.start, ThreadPoolExecutor.submit
            for cls, name, hook in _HOOKS:
                setattr(cls, name, hook)


def release() -> None:
    """A world closed; the last one puts ``Thread.start`` and ``submit`` back (unless patched since)."""
    global _users
    with _lock:
        _users -= 1
        if _users == 0:
            for (cls, name, hook), original in zip(_HOOKS, (_start, _submit), strict=True):
                if getattr(cls, name) is hook:  # unless someone patched it since
                    setattr(cls, name, original)
