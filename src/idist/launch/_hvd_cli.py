"""``idist run --backend horovod``: horovodrun, started and watched like a rank, with nothing of it left.

horovodrun leads a session of its own and gets SIGTERM when the launcher dies (its handler then
stops its ranks). A SIGINT, SIGTERM or SIGHUP to the launcher is passed on as SIGTERM; a second
one, or ``GRACE_SECONDS`` without an end, and the launcher ends every process below it itself:
it is their subreaper, so horovod's ranks, in sessions of horovod's making, stay below it. If
the launcher is killed outright, the sweeper SIGKILLs horovodrun and everything below it, and
the sessions they are in (also those it was told as they appeared, should horovodrun be gone).
The status is horovodrun's (128 + N for signal N).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from types import FrameType

from . import _deathsig, _sessions
from ._scripts import GRACE_SECONDS as RANK_GRACE
from ._scripts import handled_signals, standard_fds

#: seconds horovodrun gets after SIGTERM (it gives its ranks 5) before everything is killed
GRACE_SECONDS = 10.0


def _end_below(leave: tuple[int, ...]) -> None:
    """SIGTERM to every process below this one, SIGKILL to those left after a grace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        found = _sessions.descendants(leave)
        _sessions.signal_below(found, sig)
        deadline = time.monotonic() + (RANK_GRACE if sig == signal.SIGTERM else 5.0)
        while found and time.monotonic() < deadline:
            time.sleep(_sessions.POLL_SECONDS)
            found = _sessions.descendants(leave)
        _sessions.reap_orphans(leave)


def run_horovodrun(cmd: list[str]) -> int:
    """Run ``cmd`` (a horovodrun command line) to its end; the launcher's exit status."""
    standard_fds()
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    with _sessions.subreaper(), handled_signals(on_signal):
        sweeper = _sessions.Sweeper()
        leave = () if sweeper.pid is None else (sweeper.pid,)
        proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=_deathsig.death_signal(signal.SIGTERM))
        try:
            sweeper.watch(proc.pid)
            sweeper.watch_tree(proc.pid)
            deadline: float | None = None
            seen = {proc.pid, os.getsid(0)}
            looked = 0.0
            while proc.poll() is None:
                if received and deadline is None:
                    proc.send_signal(signal.SIGTERM)
                    deadline = time.monotonic() + GRACE_SECONDS
                if deadline is not None and (len(received) > 1 or time.monotonic() > deadline):
                    break
                if time.monotonic() - looked > 0.5:  # the sessions horovod made for its ranks
                    looked = time.monotonic()
                    for session in _sessions.sessions_of(_sessions.descendants(leave)) - seen:
                        sweeper.watch(session)
                        seen.add(session)
                time.sleep(0.05)
        finally:
            _end_below(leave)
            proc.wait()
            _sessions.reap_orphans(leave)
            sweeper.close()
    if received:
        return 128 + received[0]
    code = proc.returncode
    return 128 - code if code < 0 else code
