"""Agreeing on a failure one rank found before it communicated (``Guard.agree``, ``Guard.look``).

The failing rank counts itself under the store key of the call it failed at (``fail_key``)
and waits. A peer that fails at the same call counts itself too: once every rank of the group
did, each raises its own error and the group stays usable, however far apart they arrived. A
peer that is in the collective instead finds the key between two slices of its wait and adds
more than the group's size: the failing rank then breaks the group, which ends that wait. No
fixed window: the wait is bounded by the timeout in force and by liveness. See docs/failures.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from torch._C._distributed_c10d import Store

from ._liveness import Lost

if TYPE_CHECKING:
    from ._comm import NativeComm

#: the first read of the counts, and the most between two (each wait three times the last: a
#: handful of requests a rank in the blind window, four a second in a long wait)
_FIRST_POLL, _MAX_POLL = 0.02, 0.25

#: the key where the first rank that broke the group says why
BROKEN_KEY = "idist/broken"


def fail_key(comm: NativeComm, seq: int | None = None) -> str:
    """The store key that counts the ranks that failed at ``comm``'s call ``seq`` (default: the
    next) before communicating, plus ``size + 1`` for each rank that waits in it instead."""
    step = comm.lockstep
    return f"idist/fail/{comm.key}/{step.seq if seq is None else seq}.{step.agreed}"


def wait_for_peers(store: Store, comms: Sequence[NativeComm], limit: float, lost: Callable[[], Lost | None]) -> bool:
    """Count this rank's failure under each comm's key and wait: True when the first comm's key
    counts every rank of it; False when a rank waits in a collective instead (a count past its
    comm's size), another rank broke the group, ``lost()`` finds a rank gone, or ``limit``
    seconds passed. The store calls run in a thread of their own, so that a store gone with its
    node cannot hold this rank."""
    keys = [fail_key(c) for c in comms]
    sizes = [len(c.ranks) for c in comms]
    outcome: list[bool] = []
    stop = threading.Event()

    def poll() -> None:
        counts = [store.add(k, 1) for k in keys]
        pause = _FIRST_POLL
        last_look = time.monotonic()
        while not stop.is_set():
            if any(c > n for c, n in zip(counts, sizes, strict=True)):
                outcome.append(False)
                return
            if counts[0] == sizes[0]:
                outcome.append(True)
                return
            if time.monotonic() - last_look > 1.0:
                last_look = time.monotonic()
                if store.check([BROKEN_KEY]):
                    outcome.append(False)
                    return
            stop.wait(pause)
            pause = min(3 * pause, _MAX_POLL)
            counts = [store.add(k, 0) for k in keys]

    thread = threading.Thread(target=_quietly(poll), daemon=True, name="idist-guard-agree")
    thread.start()
    deadline = time.monotonic() + limit
    while thread.is_alive() and time.monotonic() < deadline and lost() is None:
        thread.join(min(0.25, max(0.0, deadline - time.monotonic())))
    stop.set()
    thread.join(1.0)  # its store call in flight returns before this rank moves on (or exits)
    return bool(outcome and outcome[0])


def _quietly(fn: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except Exception:  # noqa: S110 - the store may be gone with the node that hosted it
            pass

    return run
