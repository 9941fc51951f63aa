"""What the guard concludes about a failure (``Verdict``), and the bounded store calls it uses.

A verdict says what failed, which fault it was (by code, never by the backend's wording),
which ranks did not arrive and why; ``error()`` is the typed exception every caller raises.
Every store round trip made while judging is bounded (``bounded``): the store may be gone
with its node, and a call on a store cut off by a partition never returns by itself.
"""

from __future__ import annotations

import atexit
import enum
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import attrs
from torch._C._distributed_c10d import Store

from ..._errors import CollectiveMismatchError, CollectiveTimeoutError, GroupBrokenError, IdistError, PeerLostError
from ._pulse import read1

R = TypeVar("R")


class Fault(enum.Enum):
    """Why a collective failed; each fault has one error class (``ERRORS``)."""

    #: it ran for the whole timeout in force (the section's, checked mode's or the group's)
    TIMEOUT = "timeout"
    #: a peer died, closed its connections, or stopped answering (liveness)
    LOST = "lost"
    #: a peer broke the group on purpose (its own error), and said so in the store
    BROKEN = "broken"
    #: every rank waits in a collective, and not the same one (``_crossed``): they never pair
    MISMATCH = "mismatch"


ERRORS: dict[Fault, type[IdistError]] = {
    Fault.TIMEOUT: CollectiveTimeoutError,
    Fault.LOST: PeerLostError,
    Fault.BROKEN: GroupBrokenError,
    Fault.MISMATCH: CollectiveMismatchError,
}


@attrs.frozen
class Verdict:
    """A failed collective, judged: ``error()`` is what to raise, ``reason`` why the group is broken."""

    #: the collective ("all_reduce") and its group's ranks
    call: str
    group: tuple[int, ...]
    fault: Fault
    #: the ranks that did not arrive (or went silent), in rank order
    missing: tuple[int, ...] = ()
    #: what is known beyond the missing ranks, in words ("the store on node 0 did not answer")
    why: str = ""
    #: the backend's own first line, when it raised
    backend: str = ""
    #: ranks per node, to name the nodes of the missing ranks
    nproc_per_node: int = 0

    @property
    def where(self) -> str:
        if self.fault is Fault.MISMATCH:  # the ranks' calls differ: name none of them here
            return f"the collectives on group {list(self.group)} failed"
        return f"{self.call} on group {list(self.group)} failed"

    @property
    def who(self) -> str:
        if self.fault is Fault.BROKEN:
            return f"the group was broken by {self.why}"
        if self.fault is Fault.MISMATCH:
            return self.why
        if not self.missing:
            return "no rank is known to be missing" + (f" ({self.why})" if self.why else "")
        nodes = _nodes(self.missing, self.nproc_per_node)
        detail = "; ".join(part for part in (nodes, self.why) if part)
        return f"ranks {list(self.missing)} did not arrive" + (f" ({detail})" if detail else "")

    @property
    def reason(self) -> str:
        """Why every later call raises ``GroupBrokenError``."""
        if self.fault is Fault.BROKEN:
            return self.why
        return (
            "the ranks waited in different collectives, which never pair"
            if self.fault is Fault.MISMATCH
            else f"{self.call} failed ({self.who})"
        )

    def error(self) -> IdistError:
        said = f". Backend said: {self.backend}" if self.backend and self.fault is not Fault.BROKEN else ""
        return ERRORS[self.fault](
            f"{self.where}: {self.who}{said}; the group is no longer usable: finalize and restart"
        )


def _nodes(ranks: Sequence[int], nproc_per_node: int) -> str:
    if nproc_per_node <= 0:
        return ""
    nodes = sorted({r // nproc_per_node for r in ranks})
    return f"node{'s' if len(nodes) > 1 else ''} {', '.join(map(str, nodes))}"


def first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0][:300] if text else type(exc).__name__


def bounded(fn: Callable[[], R], seconds: float) -> R | None:
    """``fn()`` in a daemon thread, given ``seconds``; None when it fails or does not return."""
    request = Request(fn)
    request.thread.join(seconds)
    return request.value


class Request(Generic[R]):
    """``fn()`` in a daemon thread of its own, started now: ``value`` once ``done`` (None when it
    failed). One still running when the interpreter exits is joined then (``_join_at_exit``)."""

    def __init__(self, fn: Callable[[], R]) -> None:
        self._out: list[R] = []

        def run() -> None:
            try:
                self._out.append(fn())
            except Exception:  # noqa: S110 - the store may be gone with the node that hosted it
                pass

        self.thread = threading.Thread(target=run, daemon=True, name="idist-guard-store")
        self.thread.start()
        _in_flight(self.thread)

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()

    @property
    def value(self) -> R | None:
        return self._out[0] if self._out else None


#: store calls started by a ``Request``, the finished ones pruned at each start; joined at exit
_IN_FLIGHT: list[threading.Thread] = []
#: how long the interpreter's exit waits for them, in all
EXIT_WAIT = 10.0


def _in_flight(t: threading.Thread) -> None:
    if not _IN_FLIGHT:
        atexit.register(_join_at_exit)
    _IN_FLIGHT[:] = [*(x for x in _IN_FLIGHT if x.is_alive()), t]


def _join_at_exit() -> None:
    """Wait for store calls still in flight: a daemon thread that is inside torch's C++ when the
    interpreter ends is unwound through code that cannot unwind, and the process aborts."""
    deadline = time.monotonic() + EXIT_WAIT
    for t in list(_IN_FLIGHT):
        t.join(max(0.0, deadline - time.monotonic()))


def read(store: Store, key: str) -> str:
    """``key``'s text, "" when absent (one request)."""
    return (read1(store, key) or b"").decode("utf-8", "replace")
