"""Simulated ranks: one thread per rank, real gloo process groups over an in-memory store.

Each rank thread owns a ``NativeContext`` built by ``create_in_process`` (it never touches
torch's default group) and runs every job in a fresh ``contextvars.Context`` with that
context made current, so ``idist.all_reduce(x)`` inside the job talks to this rank's group
and one rank's ``current()`` never leaks into another's, whatever the interpreter's rule
for what new threads inherit.

Failure: a rank whose job raises drops its context at once (its process group closes its
connections), so peers blocked on it in a collective fail within milliseconds instead of
waiting for the group's timeout. The world is then rebuilt before the next run.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import ctypes
import datetime
import itertools
import queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import TypeVar, final

from torch._C._distributed_c10d import HashStore, PrefixStore
from typing_extensions import TypeVarTuple, Unpack

from .._backends.native import NativeContext
from .._stack import use
from ._jobs import BaseWorld
from ._outcomes import Outcomes

R = TypeVar("R")
Ts = TypeVarTuple("Ts")

#: seconds; a run (one call of ``fn`` on every rank) that takes longer fails
DEFAULT_TIMEOUT = 60.0
_worlds = itertools.count()


#: seconds past its group's timeout that an abandoned rank thread gets to end at exit
EXIT_GRACE = 5.0
#: seconds the rank threads of a timed-out run get to end once interrupted
ABORT_GRACE = 0.3


class Abandoned(BaseException):
    """Raised inside a rank's code when its simulated run timed out (a BaseException, so that
    ``except Exception`` in user code does not keep the thread alive)."""


#: rank threads left running by a timed-out run, and when they should have ended
_abandoned: list[tuple[threading.Thread, float]] = []


@atexit.register
def _join_abandoned() -> None:
    # A thread still inside gloo when the interpreter exits makes the C++ runtime abort the
    # process ("terminate called without an active exception"): let those calls time out.
    for t, until in _abandoned:
        t.join(max(0.0, until - time.monotonic()))


def _pg_timeout(timeout: float) -> datetime.timedelta:
    # A collective that waits for a rank that never comes must fail (and free its thread)
    # before the run's own deadline, so the threads end instead of outliving the run.
    return datetime.timedelta(seconds=max(0.05, min(timeout * 0.9, timeout - 0.5)))


def _scrub(exc: BaseException) -> BaseException:
    """Drop the frames' locals from ``exc``'s tracebacks so nothing keeps the rank's group alive.

    The traceback still shows every file and line; only the frames' variables go (a frame
    holding the context would keep its gloo connections open and peers blocked on them).
    """
    tb = exc.__traceback__
    if tb is not None:
        exc.__traceback__ = tb.tb_next  # the worker's own frame, still executing
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__]
    return exc


def _call(ctx: NativeContext, fn: Callable[..., object], args: tuple[object, ...]) -> object:
    with use(ctx):
        return fn(ctx, *args)


# (world run id or None for set-up, rank, ok, value or exception)
_Report = tuple[int | None, int, bool, object]


class _Rank(threading.Thread):
    def __init__(
        self,
        world: int,
        rank: int,
        size: int,
        store: PrefixStore,
        timeout: float,
        checked: bool,
        out: queue.SimpleQueue[_Report],
    ) -> None:
        super().__init__(name=f"idist-sim-{world}-rank{rank}", daemon=True)
        self.rank = rank
        self.size = size
        self.store = store
        self.timeout = timeout
        self.checked = checked
        self.ctx: NativeContext | None = None
        self.out = out
        self.jobs: queue.SimpleQueue[tuple[int, Callable[..., object], tuple[object, ...]] | None] = queue.SimpleQueue()

    def abort(self) -> None:
        """From another thread: break this rank's group and raise ``Abandoned`` in its code."""
        ctx = self.ctx
        if ctx is not None and not ctx.closed:
            with contextlib.suppress(Exception):
                ctx._break("the simulated run timed out")
        if self.is_alive() and self.ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.ident), ctypes.py_object(Abandoned))

    def run(self) -> None:
        try:
            ctx = self.ctx = NativeContext.in_process(
                self.store, self.rank, self.size, timeout=_pg_timeout(self.timeout), checked=self.checked
            )
        except BaseException as exc:
            self.out.put((None, self.rank, False, _scrub(exc)))
            return
        del self.store
        try:
            while (job := self.jobs.get()) is not None:
                run_id, fn, args = job
                del job
                try:
                    value = contextvars.Context().run(_call, ctx, fn, args)
                except BaseException as exc:
                    del fn, args
                    self.out.put((run_id, self.rank, False, _scrub(exc)))
                    return  # the finally below drops the context: peers blocked on us fail now
                del fn, args
                self.out.put((run_id, self.rank, True, value))
                del value
        finally:
            self.ctx = None  # the last reference: the group and its connections go with it
            ctx.close()
            del ctx


@final
class SimulatedWorld(BaseWorld):
    """``world_size`` simulated ranks in this process, kept between runs.

    ``run(fn, *args)`` calls ``fn(ctx, *args)`` on every rank at once (``ctx`` is that
    rank's ``NativeContext``, also made current, so ``idist.get_rank()`` and the module
    collectives work inside ``fn``) and returns the results in rank order. A rank that
    raises makes ``run`` raise ``RankFailedError`` naming it (chained to its exception)
    once every rank has stopped; a run longer than ``timeout`` seconds raises
    ``WorldTimeoutError`` naming the ranks that did not finish. Close it (or use it as a
    context manager) to end its threads; nothing else is left behind.
    """

    KIND = "threads"

    def __init__(self, world_size: int, *, timeout: float = DEFAULT_TIMEOUT, checked: bool = True) -> None:
        super().__init__(world_size, timeout=timeout, checked=checked)
        self._ranks: list[_Rank] = []
        self._out: queue.SimpleQueue[_Report] = queue.SimpleQueue()
        self._runs = itertools.count(1)
        self._lock = threading.Lock()

    def _start(self) -> None:
        world = next(_worlds)
        # One fresh in-memory store per world; the prefix keeps its keys apart from any
        # other user of it, and the store goes away with the world.
        store = PrefixStore(f"idist/simulate/{world}", HashStore())
        self._out = queue.SimpleQueue()
        self._ranks = [
            _Rank(world, r, self.world_size, store, self.timeout, self.checked, self._out)
            for r in range(self.world_size)
        ]
        for t in self._ranks:
            t.start()

    def run(self, fn: Callable[[NativeContext, Unpack[Ts]], R], *args: *Ts) -> list[R]:
        """Call ``fn(ctx, *args)`` on every rank; the results in rank order."""
        with self._lock:
            return self._run(fn, args)

    def _run(self, fn: Callable[..., R], args: tuple[object, ...]) -> list[R]:
        if not self._ranks or not all(t.is_alive() for t in self._ranks):
            self._stop(wait=5.0)
            self._start()
        run_id = next(self._runs)
        for t in self._ranks:
            t.jobs.put((run_id, fn, args))
        out: Outcomes[R] = Outcomes(self.world_size)
        deadline = time.monotonic() + self.timeout
        try:
            while out.unfinished:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    rid, rank, ok, value = self._out.get(timeout=left)
                except queue.Empty:
                    break
                if rid is not None and rid != run_id:
                    continue  # a late report from an abandoned run
                out.add(rank, ok, value)
        except BaseException:
            self._abandon()
            raise
        if out.unfinished:
            self._abandon()
            raise out.timeout_error(self.timeout) from next(iter(out.failures.values()), None)
        if out.failures:
            self._stop(wait=5.0)
            out.raise_first_failure()
        return out.in_rank_order()

    def _stop(self, wait: float) -> None:
        ranks, self._ranks = self._ranks, []
        for t in ranks:
            t.jobs.put(None)
        deadline = time.monotonic() + wait
        for t in ranks:
            t.join(max(0.0, deadline - time.monotonic()))

    def _abandon(self) -> None:
        """After a timeout: break every rank's group (a rank blocked on a peer fails at once),
        interrupt the ranks still running Python code, and give them a moment to end."""
        ranks, self._ranks = self._ranks, []
        for t in ranks:
            t.jobs.put(None)
            t.abort()
        deadline = time.monotonic() + ABORT_GRACE
        for t in ranks:
            t.join(max(0.0, deadline - time.monotonic()))
        # one still alive is inside C code that ignores both (time.sleep...): a daemon, it ends
        # by itself, at the latest at its group's timeout
        until = time.monotonic() + _pg_timeout(self.timeout).total_seconds() + EXIT_GRACE
        _abandoned[:] = [(t, u) for t, u in _abandoned if t.is_alive()]
        _abandoned.extend((t, until) for t in ranks if t.is_alive())

    def close(self) -> None:
        """End every rank thread and release the process groups. Safe to call twice."""
        with self._lock:
            self._stop(wait=self.timeout)


def simulate(
    world_size: int,
    fn: Callable[[NativeContext, Unpack[Ts]], R],
    *args: *Ts,
    timeout: float = DEFAULT_TIMEOUT,
    checked: bool = True,
) -> list[R]:
    """Run ``fn(ctx, *args)`` once per rank of a simulated world; the results in rank order.

    Every rank is a thread of this process with a real gloo process group over an
    in-memory store, and runs in a fresh ``contextvars`` context with its own ``ctx``
    current (``idist.get_rank()``, ``idist.all_reduce(...)`` work inside ``fn``). Raises
    ``RankFailedError`` (``.rank``, chained to the rank's exception) when a rank raises,
    ``WorldTimeoutError`` (``.unfinished``) when the run takes longer than ``timeout``
    seconds. No thread, store or process group is left behind, except a thread stuck in a
    Python loop of its own after a timeout (a daemon: it cannot be stopped from outside).
    """
    with SimulatedWorld(world_size, timeout=timeout, checked=checked) as world:
        return world.run(fn, *args)
