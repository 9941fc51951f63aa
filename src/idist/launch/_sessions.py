"""Every process a rank starts, found and ended: a session per rank, and the sweeper.

Each rank leads a session of its own (``setsid``), so whatever it starts stays in that session,
even once orphaned, unless it detaches on purpose (``setsid``, ``start_new_session=True``).
``end(sessions)`` signals every process of the ranks' sessions: SIGTERM, SIGKILL after a grace.
A launcher killed with SIGKILL runs no clean-up, so every launch also starts the *sweeper*
(this file run as a script, standard library only): it learns each rank's session and, when its
launcher dies, SIGKILLs whatever is left in them. See docs/design.md, "Launching".
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator

#: how often a wait for processes to end looks again
POLL_SECONDS = 0.02
#: Seconds the other ranks get, after one failed, to end by themselves before they are stopped:
#: ranks usually fail together (a peer or the store lost, seen a slice apart), and a rank's own
#: report (its traceback, its except and finally blocks) is the truth about it.
SETTLE_SECONDS = 2.0
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37


def stat(pid: int) -> tuple[int, int, int, str] | None:
    """(parent, session, start time in clock ticks, state) of ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2 :].split()  # the command name may hold spaces and parentheses
    return int(fields[1]), int(fields[3]), int(fields[19]), fields[0].decode()


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def members(sessions: Collection[int]) -> list[int]:
    """The live processes (zombies left out) of ``sessions``, this one excepted."""
    me = os.getpid()
    found = []
    for pid in _pids():
        st = stat(pid) if pid != me else None
        if st is not None and st[1] in sessions and st[3] != "Z":
            found.append(pid)
    return found


def children() -> list[int]:
    """This process's child processes (orphans that came to a subreaper included)."""
    me = os.getpid()
    return [pid for pid in _pids() if (st := stat(pid)) is not None and st[0] == me]


def descendants(leave: Collection[int] = (), roots: Collection[int] = ()) -> list[int]:
    """The live processes below this one (or below ``roots``: their children, theirs...), those in
    ``leave`` and below left out."""
    below: dict[int, list[int]] = {}
    for pid in _pids():
        st = stat(pid)
        if st is not None and st[3] != "Z":
            below.setdefault(st[0], []).append(pid)
    starts = [c for r in roots or [os.getpid()] for c in below.get(r, [])]
    found, todo = [], [p for p in starts if p not in leave]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += [p for p in below.get(pid, []) if p not in leave]
    return found


def sessions_of(pids: Collection[int]) -> set[int]:
    """The sessions that ``pids`` (those still there) belong to."""
    return {st[1] for pid in pids if (st := stat(pid)) is not None}


def _send(pid: int, sig: int, belongs: Callable[[tuple[int, int, int, str]], bool]) -> None:
    """``sig`` to ``pid`` if it still ``belongs`` (checked through a pidfd where the kernel has
    them, so that a pid reused in between is never signalled)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = -1
    try:
        st = stat(pid)
        if st is None or not belongs(st):
            return
        if fd >= 0:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    finally:
        if fd >= 0:
            os.close(fd)


def signal_below(pids: Collection[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids`` (found by ``descendants``) whose parent is still this
    process or one of ``pids``."""
    parents = {*pids, os.getpid()}
    for pid in pids:
        _send(pid, sig, lambda st: st[0] in parents)


def signal_sessions(sessions: Collection[int], sig: int) -> int:
    """Send ``sig`` to every live process of ``sessions``; how many there were."""
    found = members(sessions)
    for pid in found:
        _send(pid, sig, lambda st: st[1] in sessions)
    return len(found)


def wait_empty(sessions: Collection[int], seconds: float, hurry: threading.Event | None = None) -> bool:
    """Wait until ``sessions`` have no live process, at most ``seconds`` (less once ``hurry`` is
    set); whether they are empty."""
    deadline = time.monotonic() + seconds
    while members(sessions):
        if time.monotonic() >= deadline or (hurry is not None and hurry.is_set()):
            return False
        time.sleep(POLL_SECONDS)
    return True


def end(sessions: Collection[int], grace: float, hurry: threading.Event | None = None) -> None:
    """End every process of ``sessions``: SIGTERM, then SIGKILL to those left after ``grace``
    seconds (at once for ``grace=0``, or when ``hurry`` is set: a second Ctrl-C), and wait
    (bounded) for them to go."""
    if not sessions:
        return
    if grace > 0 and signal_sessions(sessions, signal.SIGTERM) and wait_empty(sessions, grace, hurry):
        return
    for _ in range(50):  # a process may fork while it is being killed: look again
        if not signal_sessions(sessions, signal.SIGKILL) or wait_empty(sessions, 0.1):
            return


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """This process adopts its descendants' orphans for the block (``PR_SET_CHILD_SUBREAPER``,
    restored after): a rank's child whose parent exits stays below the launcher, which reaps it."""
    before = _prctl(PR_GET_CHILD_SUBREAPER, 0)
    changed = not before and _prctl(PR_SET_CHILD_SUBREAPER, 1) == 0
    try:
        yield
    finally:
        if changed:
            _prctl(PR_SET_CHILD_SUBREAPER, 0)


def _prctl(option: int, value: int) -> int:
    """prctl(2) for the subreaper flag: the flag for GET (0 where it cannot be read), else the result."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return -1
    if option == PR_GET_CHILD_SUBREAPER:
        out = ctypes.c_int(0)
        return int(out.value) if prctl(option, ctypes.byref(out), 0, 0, 0) == 0 else 0
    return int(prctl(option, value, 0, 0, 0))


def reap_orphans(keep: Collection[int]) -> None:
    """Reap this process's exited children that are not in ``keep`` (the orphans a subreaper adopts)."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None:
            return
        if info.si_pid in keep:
            break  # a rank kept unreaped (its pid is its session's id): look at each child instead
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, os.WNOHANG)
    for pid in children():
        if pid not in keep:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


class Sweeper:
    """The launcher's side of the sweeper: ``watch(session)`` for every rank, ``close()`` at the end
    (after the launcher ended the sessions itself); a launcher that dies without closing is swept."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # neither a terminal's signals nor a kill of our group reach it
            )
        except OSError:
            self._proc = None  # no sweeper: the rest of the clean-up still runs

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def watch(self, session: int) -> None:
        """Sweep this session."""
        self._say(f"{session}\n")

    def watch_tree(self, pid: int) -> None:
        """Sweep this process and everything below it when the sweep comes (the sessions they are
        in): for a launcher such as horovodrun, which starts its ranks in sessions of its own."""
        self._say(f"T{pid}\n")

    def _say(self, line: str) -> None:
        proc = self._proc
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                proc.stdin.write(line.encode())
                proc.stdin.flush()

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                proc.stdin.write(b"done\n")
                proc.stdin.close()
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _sweeper(launcher: int) -> None:
    """The sweeper: sessions arrive on stdin, one per line; ``done`` ends it; its launcher's death
    (its pidfd, its parent pid, or stdin closed without ``done``) makes it SIGKILL them all."""
    sessions: set[int] = set()
    trees: set[int] = set()
    try:
        pidfd = os.pidfd_open(launcher)
    except (AttributeError, OSError):
        pidfd = -1
    buffer = b""
    while True:
        waitables = [0] + ([pidfd] if pidfd >= 0 else [])
        ready, _, _ = select.select(waitables, [], [], 0.5)
        if 0 in ready:
            data = os.read(0, 4096)
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line == b"done":
                    return
                if line.isdigit():
                    sessions.add(int(line))
                elif line[:1] == b"T" and line[1:].isdigit():
                    trees.add(int(line[1:]))
            if data:
                continue
        elif pidfd not in ready and os.getppid() == launcher:
            continue
        # the whole tree first: a process killed before its children are found orphans them
        below = [*trees, *descendants(roots=trees)] if trees else []
        end(sessions | sessions_of(below), grace=0)
        return


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _sweeper(int(sys.argv[1]))
