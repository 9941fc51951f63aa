"""Stopping spawned ranks: SIGTERM, SIGKILL after a grace, and whatever they started with them.

Each rank leads a session of its own (``_child``), so ``stop`` signals every process of those
sessions, and the rank itself directly until it has made its session. Ranks stay unreaped until
then (``Rank.poll`` looks without reaping): a rank's pid is its session's id, and a reaped pid
may be reused. A Ctrl-C while ``stop`` waits out the grace sends SIGKILL at once
(``Escalating``) instead of cutting the stop short and leaving the ranks to finish by themselves;
one while a rank starts waits until the rank is known (``Held``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import FrameType, TracebackType
from typing import Any

import attrs

from . import _sessions

#: Seconds the ranks (and what they started) get to exit after SIGTERM before they are killed.
GRACE_SECONDS = 3.0


@attrs.define(eq=False)
class Rank:
    local_rank: int
    rank: int
    process: BaseProcess
    conn: Connection | None
    message: tuple[Any, ...] | None = None
    exitcode: int | None = None

    @property
    def finished(self) -> bool:
        """Exited (and from here on never signalled: once reaped, its pid may be another process's)."""
        return self.exitcode is not None

    def poll(self) -> int | None:
        """The exit code (-N for signal N), or None while it runs; the process is left unreaped."""
        pid = self.process.pid
        if self.exitcode is None and pid is not None:
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # not ours (a forkserver's), or reaped by multiprocessing already
                self.exitcode = self.process.exitcode
            else:
                if info is not None:
                    self.exitcode = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        return self.exitcode


class _TakesCtrlC:
    """For the block, SIGINT goes to ``_on_int`` instead of raising ``KeyboardInterrupt`` (in the
    main thread, with Python's default handler in place); one that came is raised after the block,
    unless an exception is on its way already."""

    def __init__(self) -> None:
        self.came = False
        self.active = (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        )

    def _on_int(self, signum: int, frame: FrameType | None) -> None:
        self.came = True

    def __enter__(self) -> None:
        if self.active:
            signal.signal(signal.SIGINT, self._on_int)

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if not self.active:
            return
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if self.came and et is None and sys.exc_info()[1] is None:
            raise KeyboardInterrupt


class Escalating(_TakesCtrlC):
    """For a stop: a Ctrl-C sets ``hurry`` (SIGKILL now) instead of cutting the stop short."""

    def __init__(self, hurry: threading.Event) -> None:
        super().__init__()
        self.hurry = hurry

    def _on_int(self, signum: int, frame: FrameType | None) -> None:
        self.came = True
        self.hurry.set()


class Held(_TakesCtrlC):
    """For a rank's start: a Ctrl-C waits until the new process is known to its handle (raised
    inside ``Process.start``, or just after it, it would leave a rank running that nobody stops,
    and multiprocessing's exit hook would wait for it); a second one raises at once, so that a
    start that hangs stays interruptible."""

    def _on_int(self, signum: int, frame: FrameType | None) -> None:
        if self.came:
            raise KeyboardInterrupt
        self.came = True


def _signal(r: Rank, sig: int) -> None:
    """``sig`` to a rank that has not made its session yet (the session's members get it anyway)."""
    pid = r.process.pid
    if pid is None or r.poll() is not None:
        return
    try:
        if os.getsid(pid) != pid:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_gone(ranks: Sequence[Rank], sessions: list[int], seconds: float, hurry: threading.Event | None) -> bool:
    """Wait until no rank runs and the sessions are empty, at most ``seconds`` (less once ``hurry``
    is set); whether they are."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [r.process.sentinel for r in ranks if r.poll() is None]
        if not alive and not _sessions.members(sessions):
            return True
        if time.monotonic() >= deadline or (hurry is not None and hurry.is_set()):
            return False
        if alive:
            wait(alive, timeout=_sessions.POLL_SECONDS)
        else:
            time.sleep(_sessions.POLL_SECONDS)


def stop(ranks: Sequence[Rank], hurry: threading.Event, grace: float = GRACE_SECONDS) -> None:
    """End every rank and every process of the ranks' sessions: SIGTERM, then SIGKILL to what is
    left after ``grace`` seconds (at once when ``hurry`` is set), then reap the ranks."""
    sessions = [r.process.pid for r in ranks if r.process.pid is not None]
    with Escalating(hurry):
        if not hurry.is_set():
            for r in ranks:
                _signal(r, signal.SIGTERM)
            _sessions.signal_sessions(sessions, signal.SIGTERM)
            gone = _wait_gone(ranks, sessions, grace, hurry)
        else:
            gone = False
        for _ in range(50):  # a process may fork while it is being killed: look again
            if gone:
                break
            for r in ranks:
                _signal(r, signal.SIGKILL)
            _sessions.signal_sessions(sessions, signal.SIGKILL)
            gone = _wait_gone(ranks, sessions, 0.1, None)
        for r in ranks:
            r.process.join(5.0)
            r.poll()
