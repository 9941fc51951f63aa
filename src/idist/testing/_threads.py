"""Simulated ranks: one thread per rank, gloo-like process groups that meet in memory (``_transport``).

Each rank owns a ``NativeContext`` whose groups come from the world's ``Hub``: no socket,
file or extra thread per rank or pair, so hundreds of ranks fit in one process. A run gives
every rank its own deep copy of the arguments and runs the job in a fresh
``contextvars.Context`` with the rank's context current; threads the rank starts work for
it (``_inherit``). Process-wide state is captured before the run and restored after (``_state``).

Failure: the first rank whose job raises breaks the world at once (``Hub.abort``): peers
waiting in a collective raise ``GroupBrokenError`` naming it within milliseconds, and a rank
that returns while peers wait for it fails their call. The world is rebuilt before the next run
whenever a group failed or a context broke, whether or not the run returned normally.
"""

from __future__ import annotations

import datetime
import itertools
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import final

from torch._C._distributed_c10d import HashStore, PrefixStore
from typing_extensions import Unpack

from .. import _stack
from .._backends.native import NativeContext
from .._errors import LaunchConfigError
from . import _inherit
from ._args import per_rank
from ._jobs import BaseWorld
from ._outcomes import Outcomes
from ._processes import LONGEST, R, Ts
from ._rank import Rank, Report, abandon
from ._state import ProcessState
from ._transport import Hub

#: seconds; a run (one call of ``fn`` on every rank) that takes longer fails
DEFAULT_TIMEOUT = 60.0
#: the most ranks one simulated world serves (each is a thread of this process)
MAX_WORLD_SIZE = 1024
#: seconds the other ranks get to finish once one failed, before they are stopped
FAILURE_GRACE = 1.0
#: seconds the rank threads of a stopped run get to end once interrupted
ABORT_GRACE = 0.3
#: seconds a failing rank waits for its peers' reports of where they were (one process: moments)
STALL_GRACE = 0.25
_worlds = itertools.count()


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=min(seconds, LONGEST))


@final
class SimulatedWorld(BaseWorld):
    """``world_size`` simulated ranks in this process, kept between runs.

    ``run(fn, *args)`` calls ``fn(ctx, *args)`` on every rank at once (``ctx`` is that
    rank's ``NativeContext``, also made current, so ``idist.get_rank()`` and the module
    collectives work inside ``fn``) and returns the results in rank order. Each rank gets its
    own deep copy of ``args`` (``share_args=True``: the same objects, see docs/testing.md).
    A rank that raises makes ``run`` raise ``RankFailedError`` naming the rank whose own
    exception started the failure (chained to it); a run longer than ``timeout`` seconds
    (``math.inf``: no limit) raises ``WorldTimeoutError`` naming the ranks that did not
    finish. Close it (or use it as a context manager) to end its threads; nothing else is
    left behind. At most ``MAX_WORLD_SIZE`` ranks; more raise ``LaunchConfigError`` at once.
    """

    KIND = "threads"

    def __init__(
        self, world_size: int, *, timeout: float = DEFAULT_TIMEOUT, checked: bool = True, share_args: bool = False
    ) -> None:
        super().__init__(world_size, timeout=timeout, checked=checked)
        if world_size > MAX_WORLD_SIZE:
            raise LaunchConfigError(
                f"a simulated world has at most {MAX_WORLD_SIZE} ranks (threads of this process), got "
                f"{world_size}; use ProcessWorld or a real launcher (idist run) for more"
            )
        self.share_args = bool(share_args)
        self._ranks: list[Rank] = []
        self._hub: Hub | None = None
        self._out: queue.SimpleQueue[Report] = queue.SimpleQueue()
        self._runs = itertools.count(1)
        self._lock = threading.Lock()

    def _start(self) -> None:
        world, n = next(_worlds), self.world_size
        hub = Hub(n)
        # the guard's keys (who broke the group, stall reports) live in memory, with the world
        store = PrefixStore(f"idist/simulate/{world}", HashStore())
        td = _timedelta(self.timeout)
        out: queue.SimpleQueue[Report] = queue.SimpleQueue()
        ranks = []
        for r in range(n):
            ctx = NativeContext.in_process(
                store, r, n, timeout=td, checked=self.checked, groups=lambda ranks, g: hub.group(ranks, g, self.timeout)
            )
            guard = ctx._state.world.guard
            guard.checked_wait = td  # the user's timeout governs checked mode's waits too
            guard.stall_grace = STALL_GRACE
            ranks.append(Rank(world, ctx, hub, out))
        _inherit.acquire()
        try:
            for t in ranks:
                t.start()
        except RuntimeError as exc:  # the system refused a thread: no rank has run any code yet
            self._ranks = ranks
            self._stop(wait=5.0)
            raise LaunchConfigError(
                f"could not start {n} simulated ranks here ({exc}): the process may not start that many threads; "
                "use fewer ranks, or ProcessWorld"
            ) from exc
        self._hub, self._out, self._ranks = hub, out, ranks

    def run(self, fn: Callable[[NativeContext, Unpack[Ts]], R], *args: *Ts) -> list[R]:
        """Call ``fn(ctx, *args)`` on every rank; the results in rank order."""
        with self._lock:
            return self._run(fn, args)

    def _spoiled(self) -> bool:
        hub = self._hub
        return (
            hub is None
            or hub.spoiled
            or any(not t.is_alive() or t.ctx.closed or t.ctx._broken() is not None for t in self._ranks)
        )

    def _run(self, fn: Callable[..., R], args: tuple[object, ...]) -> list[R]:
        copies = per_rank(args, self.world_size, self.share_args)
        if self._spoiled():
            self._stop(wait=5.0)
            self._start()
        hub = self._hub
        assert hub is not None
        run_id = next(self._runs)
        state = ProcessState.capture()
        hub.begin_run()
        try:
            with _stack.simulated_run():
                for t, a in zip(self._ranks, copies, strict=True):
                    t.jobs.put((run_id, fn, a))
                del copies
                out: Outcomes[R] = self._collect(run_id)
        finally:
            state.restore()
        if out.failures:
            self._stop(wait=5.0)
            out.raise_first_failure()
        return out.in_rank_order()

    def _collect(self, run_id: int) -> Outcomes[R]:
        out: Outcomes[R] = Outcomes(self.world_size)
        deadline = time.monotonic() + self.timeout
        failed_at = math.inf
        try:
            while out.unfinished:
                until = min(deadline, failed_at + FAILURE_GRACE)
                left = until - time.monotonic()
                if left <= 0:
                    break
                try:
                    rid, rank, ok, value = self._out.get(timeout=None if math.isinf(left) else left)
                except queue.Empty:
                    break
                if rid != run_id:
                    continue  # a late report from a stopped run
                if not ok and not out.failures:
                    failed_at = time.monotonic()
                out.add(rank, ok, value)
        except BaseException:
            self._abandon("the simulated run was interrupted")
            raise
        if out.unfinished:
            timed_out = not out.failures
            self._abandon(f"the simulated run timed out after {self.timeout:g}s" if timed_out else "a rank failed")
            if timed_out:
                error = out.timeout_error(self.timeout)
                if self.share_args:
                    error.add_note(
                        "the ranks share their arguments (share_args=True): one model stepped by two ranks "
                        "can leave both waiting for each other inside DDP; give each rank its own copy"
                    )
                raise error
        return out

    def _stop(self, wait: float) -> None:
        ranks, self._ranks, self._hub = self._ranks, [], None
        for t in ranks:
            t.jobs.put(None)
        deadline = time.monotonic() + wait
        for t in ranks:
            if t.ident is None:  # never started: its context is closed here
                t.ctx.close()
            else:
                t.join(max(0.0, deadline - time.monotonic()))
        if ranks:
            _inherit.release()

    def _abandon(self, reason: str) -> None:
        """Stop a run that overran or failed: every call waiting in a collective raises at once, the
        other ranks still running Python code are interrupted, and each gets a moment to end."""
        ranks, hub = self._ranks, self._hub
        self._ranks, self._hub = [], None
        woken = hub.abort(reason) if hub is not None else set()
        for t in ranks:
            t.jobs.put(None)
        for t in ranks:
            if t.rank not in woken:  # a rank woken in a collective ends its job by itself
                t.interrupt()
        deadline = time.monotonic() + ABORT_GRACE
        for t in ranks:
            t.join(max(0.0, deadline - time.monotonic()))
            t.interrupt()  # a woken rank that went on past its error
        abandon(ranks)  # one still alive is in C code that ignores both (time.sleep...)
        if ranks:
            _inherit.release()

    def close(self) -> None:
        """End every rank thread and release the process groups. Safe to call twice."""
        with self._lock:
            self._stop(wait=min(self.timeout, 10.0))


def simulate(
    world_size: int,
    fn: Callable[[NativeContext, Unpack[Ts]], R],
    *args: *Ts,
    timeout: float = DEFAULT_TIMEOUT,
    checked: bool = True,
    share_args: bool = False,
) -> list[R]:
    """Run ``fn(ctx, *args)`` once per rank of a simulated world; the results in rank order.

    Every rank is a thread of this process with its own context over an in-memory transport
    that behaves as gloo does, its own deep copy of ``args`` (``share_args=True``: the same
    objects), and a fresh ``contextvars`` context with its ``ctx`` current
    (``idist.get_rank()``, ``idist.all_reduce(...)`` work inside ``fn``, and in threads it
    starts). Raises ``RankFailedError`` (``.rank``: the rank whose own exception started the
    failure, chained to it) when a rank raises, ``WorldTimeoutError`` (``.unfinished``) when
    the run takes longer than ``timeout`` seconds (``math.inf``: no limit). Process-wide
    state a rank changes (default dtype, RNG states, environment, warning filters...) is
    restored afterwards. No thread, store or group is left behind, except a thread stuck in
    C code (``time.sleep``) after a stopped run: a daemon, it ends by itself.
    """
    with SimulatedWorld(world_size, timeout=timeout, checked=checked, share_args=share_args) as world:
        return world.run(fn, *args)
