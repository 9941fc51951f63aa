"""``SpawnHandle``: the running ranks of one launch, watched together, stopped together.

The parent waits on every rank at once (each rank's process sentinel and its result
pipe), never on one after another. The first rank that raises, exits non-zero or is
killed makes the parent stop the others (SIGTERM to each rank's process group, SIGKILL
after a grace period) and raise ``LaunchError`` with that rank's number, exit code or
signal and traceback. Ctrl-C (or any exception) while waiting stops every rank the same way.
"""

from __future__ import annotations

import os
import signal
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import TracebackType
from typing import Any, Generic, TypeVar, cast, final

import attrs

from .._errors import LaunchError
from ._plan import LaunchPlan
from ._ports import PortReservation

R = TypeVar("R")

#: Seconds the other ranks get to exit after SIGTERM before they are killed.
GRACE_SECONDS = 3.0


def signal_name(exitcode: int) -> str | None:
    if exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


@attrs.define(eq=False)
class _Rank:
    local_rank: int
    rank: int
    process: BaseProcess
    conn: Connection | None
    message: tuple[Any, ...] | None = None
    exitcode: int | None = None

    @property
    def finished(self) -> bool:
        """Exited and reaped: from here on its pid may belong to another process."""
        return self.exitcode is not None

    def poll(self) -> int | None:
        # Every reap goes through here, so ``finished`` is exactly "reaped".
        if self.exitcode is None:
            self.exitcode = self.process.exitcode
        return self.exitcode


@attrs.frozen
class _Failure:
    rank: _Rank
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

    def __init__(self, ranks: list[_Rank], reservation: PortReservation | None, plan: LaunchPlan) -> None:
        self._ranks = ranks
        self._reservation = reservation
        self.plan = plan
        self._error: LaunchError | None = None

    @property
    def processes(self) -> list[BaseProcess]:
        return [r.process for r in self._ranks]

    @property
    def pids(self) -> list[int]:
        return [r.process.pid for r in self._ranks if r.process.pid is not None]

    @property
    def master_port(self) -> int | None:
        return self.plan.master_port

    def done(self) -> bool:
        return all(r.finished for r in self._ranks)

    @property
    def results(self) -> list[R]:
        """Each local rank's return value, in local-rank order (after a successful join)."""
        if self._error is not None:
            raise self._error
        if not self.done():
            raise LaunchError("the ranks are still running: call join() first")
        return [cast(R, r.message[1] if r.message else None) for r in self._ranks]

    def join(self, timeout: float | None = None) -> bool:
        """Wait for every rank. True when all finished, False when ``timeout`` ran out.

        Raises ``LaunchError`` for the first rank that failed, after stopping the others;
        an exception here (Ctrl-C included) also stops every rank before propagating.
        """
        if self._error is not None:
            raise self._error
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self.done():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                failures = self._step(left)
                if failures:
                    first = min(failures, key=lambda f: f.when)
                    self._stop()
                    self._error = self._launch_error(first)
                    raise self._error
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
        ready = set(wait(waitables, timeout=1.0 if timeout is None else min(timeout, 1.0)))
        now = time.time()
        failures: list[_Failure] = []
        for r in pending:
            if r.conn is not None and (r.conn in ready or r.process.sentinel in ready):
                self._read(r)
            if r.message is not None and r.message[0] == "error":
                _, summary, tb, when, code = r.message
                failures.append(_Failure(r, when, summary, code, tb))
                continue
            code = r.poll()
            if code is None:
                continue
            if r.conn is not None:
                self._read(r)
            if r.message is not None and r.message[0] == "error":
                _, summary, tb, when, intended = r.message
                failures.append(_Failure(r, when, summary, intended, tb))
            elif code != 0:
                sig = signal_name(code)
                what = f"was killed by {sig}" if sig else f"exited with code {code}"
                if r.message is not None:
                    what += " after fn returned"
                failures.append(_Failure(r, now, what, code, None))
            elif r.message is None:
                failures.append(_Failure(r, now, "exited with code 0 before fn returned (os._exit?)", 0, None))
        return failures

    @staticmethod
    def _read(r: _Rank) -> None:
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
        """Stop every rank still running (SIGTERM, then SIGKILL after a grace period)."""
        self._stop()

    def _signal(self, r: _Rank, sig: int) -> None:
        pid = r.process.pid
        if pid is None or r.finished:
            return  # never signal a reaped pid: it may belong to someone else now
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)  # the rank and whatever it started
            else:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _stop(self) -> None:
        alive = [r for r in self._ranks if r.poll() is None]
        for r in alive:
            self._signal(r, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_SECONDS
        while alive and time.monotonic() < deadline:
            wait([r.process.sentinel for r in alive], timeout=max(0.0, deadline - time.monotonic()))
            alive = [r for r in alive if r.poll() is None]
        for r in alive:
            self._signal(r, signal.SIGKILL)
        for r in self._ranks:
            r.process.join()
            r.poll()
            if r.conn is not None:
                r.conn.close()
                r.conn = None
        self._release()

    def _release(self) -> None:
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
        state = "done" if self.done() else "running"
        return f"<SpawnHandle {len(self._ranks)} ranks {state} pids={self.pids}>"
