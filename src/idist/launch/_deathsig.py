"""``death_signal``: a process that the kernel signals the moment its parent dies (``PR_SET_PDEATHSIG``).

Every launcher's ranks get it (``idist run``, ``spawn``, horovodrun under ``idist run``), so that
a launcher killed with SIGKILL takes its ranks with it; the sweeper (``_sessions``) then ends
whatever the ranks started.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def death_signal(sig: int, *, check: bool = True) -> Callable[[], None]:
    """What makes the kernel send ``sig`` to a process the moment its parent (this process, when
    ``check``: a new one that finds it gone already ends at once) dies: a ``preexec_fn`` that calls
    nothing but ``prctl`` (resolved here, before the fork)."""
    parent = os.getpid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None

    def arm() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if check and os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return arm
