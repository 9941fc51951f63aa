"""Freeing a process group that a collective still uses, without waiting for it or aborting.

Destroying a gloo group joins its worker threads, so a group whose collective is still in the
backend (another thread's, or one a rank stopped waiting for when the liveness watcher lost a
peer) cannot be destroyed where it is released: that could last the group's timeout.
``bury`` hands it to one daemon thread that destroys it once nothing uses it any more. At
exit, whatever is still buried is kept until the process ends (``keep_forever``): a thread
that returns from a group's destructor while the interpreter finalizes aborts the process.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable

import attrs

from ._inflight import InFlight, keep_forever

#: seconds between two looks at the buried groups
POLL = 0.05
#: how long exiting waits for a group being destroyed right now
EXIT_WAIT = 2.0


@attrs.define(eq=False)
class _Grave:
    group: object
    inflight: InFlight
    #: whether a collective of this group is still running on some thread
    busy: Callable[[], bool]

    def ready(self) -> bool:
        if self.busy():
            return False
        self.inflight.release()
        return not self.inflight.held


_lock = threading.Lock()
_graves: list[_Grave] = []
_closing = threading.Event()
_thread: list[threading.Thread] = []


def bury(group: object, inflight: InFlight, busy: Callable[[], bool]) -> None:
    """Destroy ``group`` once ``busy()`` is false and its worker threads let go of ``inflight``."""
    with _lock:
        if _closing.is_set():
            keep_forever(group, inflight)
            return
        _graves.append(_Grave(group, inflight, busy))
        if not _thread:
            _thread[:] = [threading.Thread(target=_reap, name="idist-reaper", daemon=True)]
            _thread[0].start()


def _reap() -> None:
    while not _closing.wait(POLL):
        with _lock:
            ready = [g for g in _graves if g.ready()]
            _graves[:] = [g for g in _graves if g not in ready]
            if not ready and not _graves:
                _thread.clear()  # under the lock: the next bury starts a new thread
                return
        while ready and not _closing.is_set():
            ready.pop()  # the group's last reference: destroyed here, its workers idle
        for grave in ready:  # the interpreter is exiting: never destroyed
            keep_forever(grave.group, grave.inflight)


@atexit.register
def _keep_the_rest() -> None:
    with _lock:
        _closing.set()
        thread = _thread[0] if _thread else None
    if thread is not None:
        thread.join(EXIT_WAIT)
    with _lock:
        for grave in _graves:
            keep_forever(grave.group, grave.inflight)
        _graves.clear()
