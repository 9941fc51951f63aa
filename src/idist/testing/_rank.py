"""A simulated rank: the thread that runs its jobs, and what stops it.

A rank thread owns its ``NativeContext`` and runs each job in a fresh ``contextvars.Context``
with the context current and marked as the rank's (threads it starts inherit it). The first
job that raises breaks the world at once (``Hub.abort``, after saying why where the peers'
errors will read it) and ends the thread; a job that returns tells the hub, so that a peer
waiting for this rank in a collective fails instead of waiting out the timeout. A stopped
run interrupts the ranks still running Python code with ``Abandoned``.
"""

from __future__ import annotations

import atexit
import contextvars
import ctypes
import queue
import threading
import time
from collections.abc import Callable

from .. import _stack
from .._backends.native import NativeContext
from ._errors import describe
from ._outcomes import is_consequence
from ._transport import Hub

#: seconds, all together, that threads still running at interpreter exit get to end
EXIT_GRACE = 1.0
_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc


class Abandoned(BaseException):
    """Raised inside a rank's code when its run was stopped (timed out, interrupted, or another
    rank failed): a BaseException, so that ``except Exception`` in user code does not keep it alive."""

    consequence = True


#: rank threads still running after their run was stopped
_abandoned: list[threading.Thread] = []


@atexit.register
def _join_abandoned() -> None:
    deadline = time.monotonic() + EXIT_GRACE
    for t in _abandoned:
        t.join(max(0.0, deadline - time.monotonic()))


def _call(ctx: NativeContext, fn: Callable[..., object], args: tuple[object, ...]) -> object:
    with _stack.in_rank(ctx), _stack.use(ctx):
        return fn(ctx, *args)


# (run id, rank, ok, value or exception)
Report = tuple[int, int, bool, object]


class Rank(threading.Thread):
    def __init__(self, world: int, ctx: NativeContext, hub: Hub, out: queue.SimpleQueue[Report]) -> None:
        super().__init__(name=f"idist-sim-{world}-rank{ctx.rank}", daemon=True)
        self.rank = ctx.rank
        self.ctx = ctx
        self.hub = hub
        self.out = out
        self.jobs: queue.SimpleQueue[tuple[int, Callable[..., object], tuple[object, ...]] | None] = queue.SimpleQueue()
        #: whether the rank is running a job now (only then is it interrupted)
        self.busy = False

    def interrupt(self) -> None:
        """From another thread: raise ``Abandoned`` in this rank's Python code, if it runs a job."""
        ident = self.ident
        for _ in range(50):
            if not (self.busy and self.is_alive() and ident is not None):
                return
            hit = _set_async_exc(ctypes.c_ulong(ident), ctypes.py_object(Abandoned))
            if hit <= 1:
                return
            # a thread this rank is starting carries its id until it runs: take it back, try again
            _set_async_exc(ctypes.c_ulong(ident), None)
            time.sleep(0.002)

    def run(self) -> None:
        ctx = self.ctx
        try:
            with _stack.in_rank(ctx):
                self._serve(ctx)
        except Abandoned:
            pass  # its run was stopped; the world is rebuilt
        finally:
            try:
                ctx.close()
            except BaseException:  # noqa: S110 - a stopped rank's context goes with its world
                pass

    def _serve(self, ctx: NativeContext) -> None:
        while (job := self.jobs.get()) is not None:
            run_id, fn, args = job
            del job
            self.busy = True
            try:
                value = contextvars.Context().run(_call, ctx, fn, args)
            except BaseException as exc:
                self.busy = False
                del fn, args
                self._failed(ctx, exc)
                self.out.put((run_id, self.rank, False, exc))
                return  # the world is rebuilt before the next run
            self.busy = False
            del fn, args
            self.hub.finish(self.rank, "returned from its function")
            self.out.put((run_id, self.rank, True, value))
            del value

    def _failed(self, ctx: NativeContext, exc: BaseException) -> None:
        """Break the world at once, saying why: peers waiting in a collective raise now."""
        reason = f"rank {self.rank}, which raised {describe(exc)}"
        if not is_consequence(exc):
            ctx._state.world.guard.publish_broken(reason)  # what the peers' errors will name
        self.hub.abort(reason)


def abandon(ranks: list[Rank]) -> None:
    """Keep track of rank threads a stopped run left running (in C code, ``time.sleep``...):
    daemons that end by themselves, given ``EXIT_GRACE`` at exit."""
    _abandoned[:] = [t for t in _abandoned if t.is_alive()]
    _abandoned.extend(t for t in ranks if t.is_alive())
