"""``SpawnHandle``: the running ranks of one launch, watched together, stopped together.

The parent waits on every rank at once (each rank's process sentinel and its result
pipe), never on one after another. The first rank that raises, exits non-zero or is
killed makes the parent stop the others and what they started (``_stopping``), once they
had ``SETTLE_SECONDS`` to end by themselves (ranks usually fail together), and raise
``LaunchError`` with that rank's number, exit code or signal and traceback. Ctrl-C (or any
exception) while waiting stops every rank the same way. A rank that ended without returning
(stopped by ``terminate()`` included) is a failure, never a result of ``None``.
"""

from __future__ import annotations

import signal
import threading
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import TracebackType
from typing import Generic, TypeVar, cast, final

import attrs

from .._errors import LaunchError
from . import _sessions
from ._plan import LaunchPlan
from ._ports import PortReservation
from ._stopping import GRACE_SECONDS, Rank, stop

R = TypeVar("R")


def signal_name(exitcode: int) -> str | None:
    if exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


@attrs.frozen
class _Failure:
    rank: Rank
    when: float
    summary: str
    exitcode: int | None
    traceback: str | None


@final
class SpawnHandle(Generic[R]):
    """The running ranks of one ``spawn(..., join=False)``.

    ``join()`` waits for all of them (raising ``LaunchError`` on the first failure, after
    stopping the rest); ``results`` are the return values in local-rank order;
    ``terminate()`` stops them all. As a context manager it joins on a clean exit and
    terminates on an exception.
    """

    def __init__(
        self,
        ranks: list[Rank],
        reservation: PortReservation | None,
        plan: LaunchPlan,
        sweeper: _sessions.Sweeper | None = None,
    ) -> None:
        self._ranks = ranks
        self._reservation = reservation
        self._sweeper = sweeper
        self.plan = plan
        self._error: LaunchError | None = None
        self._stopped_by: str | None = None
        self._released = False
        #: a second Ctrl-C while the ranks are being stopped: SIGKILL now
        self._hurry = threading.Event()
        #: the failures seen so far, by local rank; after the first, the others get until
        #: ``_settle_until`` to end by themselves (their own except/finally blocks run)
        self._failures: dict[int, _Failure] = {}
        self._settle_until: float | None = None

    @property
    def processes(self) -> list[BaseProcess]:
        return [r.process for r in self._ranks]

    @property
    def pids(self) -> list[int]:
        return [r.process.pid for r in self._ranks if r.process.pid is not None]

    @property
    def master_port(self) -> int | None:
        return self.plan.master_port

    def watch(self, pid: int) -> None:
        """Tell the sweeper about a rank just started (its session is swept if this process dies)."""
        if self._sweeper is not None:
            self._sweeper.watch(pid)

    def done(self) -> bool:
        """Whether every rank has ended: looks now (a rank that failed stops the others, as ``join`` does)."""
        try:
            return self.join(timeout=0)
        except LaunchError:
            return True

    @property
    def results(self) -> list[R]:
        """Each local rank's return value, in local-rank order (after a successful join).

        Raises ``LaunchError`` while the ranks run, and for a rank that failed or was stopped."""
        if not self.join(timeout=0):
            raise LaunchError("the ranks are still running: call join() first")
        return [cast(R, r.message[1] if r.message else None) for r in self._ranks]

    def join(self, timeout: float | None = None) -> bool:
        """Wait for every rank. True when all returned, False when ``timeout`` ran out (0: look once).

        Raises ``LaunchError`` for the first rank that failed (or was stopped before it
        returned), after stopping the others; an exception here (Ctrl-C included) also stops
        every rank before propagating.
        """
        if self._error is not None:
            raise self._error
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if self._settle_until is not None:
                    left = max(0.0, min(left if left is not None else 1.0, self._settle_until - time.monotonic()))
                for f in self._step(left):
                    self._failures.setdefault(f.rank.local_rank, f)  # as first seen
                if self._failures:
                    if self._settle_until is None:
                        self._settle_until = time.monotonic() + _sessions.SETTLE_SECONDS
                    if all(r.finished for r in self._ranks) or time.monotonic() >= self._settle_until:
                        first = min(self._failures.values(), key=lambda f: f.when)
                        self._stop()
                        self._error = self._launch_error(first)
                        raise self._error
                elif all(r.finished for r in self._ranks):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    return False
        except BaseException:
            self._stop()
            raise
        self._release()
        return True

    def _step(self, timeout: float | None) -> list[_Failure]:
        pending = [r for r in self._ranks if not r.finished]
        waitables: list[Connection | int] = [r.conn for r in pending if r.conn is not None]
        waitables += [r.process.sentinel for r in pending]
        # A bounded wait also catches a rank whose sentinel is held open by its children.
        ready = set(wait(waitables, timeout=1.0 if timeout is None else min(timeout, 1.0))) if pending else set()
        now = time.time()
        failures: list[_Failure] = []
        for r in pending:
            if r.conn is not None and (r.conn in ready or r.process.sentinel in ready):
                self._read(r)
            if r.message is not None and r.message[0] == "error":
                _, summary, tb, when, code = r.message
                failures.append(_Failure(r, when, summary, code, tb))
                continue
            if r.poll() is not None and r.conn is not None:
                self._read(r)
        for r in self._ranks:
            if r.finished and (r.message is None or r.message[0] != "ok" or r.exitcode != 0):
                failure = self._judge(r, now)
                if failure is not None and all(f.rank is not r for f in failures):
                    failures.append(failure)
        return failures

    def _judge(self, r: Rank, now: float) -> _Failure | None:
        """Why a rank that ended did not return a result, or None if it did."""
        code = r.exitcode
        assert code is not None
        if r.message is not None and r.message[0] == "error":
            _, summary, tb, when, intended = r.message
            return _Failure(r, when, summary, intended, tb)
        if code == 0:
            if r.message is not None:
                return None
            return _Failure(r, now, "exited with code 0 before fn returned (os._exit?)", 0, None)
        sig = signal_name(code)
        what = f"was killed by {sig}" if sig else f"exited with code {code}"
        if r.message is not None:
            what += " after fn returned"
        elif self._stopped_by is not None:
            what = f"was stopped by {self._stopped_by} before fn returned ({what.removeprefix('was ')})"
        return _Failure(r, now, what, code, None)

    @staticmethod
    def _read(r: Rank) -> None:
        conn = r.conn
        assert conn is not None
        try:
            while conn.poll(0):
                r.message = conn.recv()
        except (EOFError, OSError):
            conn.close()
            r.conn = None

    def _launch_error(self, f: _Failure) -> LaunchError:
        r = f.rank
        where = f"rank {r.rank} (local rank {r.local_rank}"
        where += f", node {self.plan.node_rank})" if self.plan.nnodes > 1 else ")"
        text = f"{where} failed: {f.summary}"
        if f.traceback:
            text += f"\n\n--- traceback of rank {r.rank} ---\n{f.traceback.rstrip()}"
        stopped = [o.rank for o in self._ranks if o is not r]
        if stopped:
            text += f"\n\nthe other ranks ({', '.join(map(str, stopped))}) were stopped"
        code = f.exitcode if f.exitcode is not None else r.exitcode
        return LaunchError(
            text,
            rank=r.rank,
            local_rank=r.local_rank,
            exitcode=code,
            signal_name=signal_name(code) if code is not None else None,
            traceback=f.traceback,
        )

    def terminate(self) -> None:
        """Stop every rank still running (SIGTERM, then SIGKILL after a grace period), and what
        they started; a later ``join()`` raises ``LaunchError`` for the ranks that had not returned."""
        if self._stopped_by is None:
            self._stopped_by = "terminate()"
        self._stop()

    def _stop(self) -> None:
        for r in self._ranks:
            if r.conn is not None:
                self._read(r)  # a result already sent still counts
        stop(self._ranks, self._hurry)
        self._release()

    def _release(self) -> None:
        """End what the ranks left running, reap them, and give back the port and the sweeper."""
        if not self._released:
            self._released = True
            _sessions.end([r.process.pid for r in self._ranks if r.process.pid is not None], GRACE_SECONDS)
            for r in self._ranks:
                r.process.join(5.0)
            if self._sweeper is not None:
                self._sweeper.close()
        if self._reservation is not None:
            self._reservation.close()
        for r in self._ranks:
            if r.conn is not None:
                r.conn.close()
                r.conn = None

    def __enter__(self) -> SpawnHandle[R]:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if et is None:
            self.join()
        else:
            self._stop()

    def __repr__(self) -> str:
        state = "done" if all(r.finished for r in self._ranks) else "running"
        return f"<SpawnHandle {len(self._ranks)} ranks {state} pids={self.pids}>"
