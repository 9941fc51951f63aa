"""Counting who arrived at an event, in O(1) store requests per member.

Each member appends its index to the event's list and adds one to its counter (``arrive``); the
member that completes the count marks the event complete. Waiting reads the counter (or blocks
on the mark), never every member's key. Only when some member is missing does ONE member read
the list (``missing``) and post the absent ones, which the others read: naming the missing costs
one read of the list in all, instead of a key per member for every member.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Protocol, cast

import attrs
from torch._C._distributed_c10d import Store

from ._pulse import read1


class _Appends(Protocol):
    def append(self, key: str, value: str, /) -> None: ...  # in torch, missing from its stubs


#: when a waiting member first reads the counter, and at most how long between two reads (each
#: wait is three times the last: 0.1, 0.4, 1.3 s... four reads in a 3 s grace)
_FIRST_POLL, _MAX_POLL = 0.1, 1.0


@attrs.frozen
class Tally:
    """Arrivals of ``size`` members (indices 0..size-1) at one event, under ``prefix``."""

    store: Store
    prefix: str
    size: int
    #: the list of who came: ``label:member`` entries, which tallies of neighbouring events may
    #: share (one append counts a member in all of them; ``missing`` accepts their labels)
    roll: str = ""
    label: str = ""
    accept: tuple[str, ...] = ("",)

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key the tally may write (to delete it once nobody reads it)."""
        return (self._roll, *(f"{self.prefix}/{k}" for k in ("n", "all", "diag", "missing")))

    @property
    def _roll(self) -> str:
        return self.roll or f"{self.prefix}/who"

    def note(self, member: int) -> None:
        """Put ``member`` on the list (one request that the store does not answer)."""
        cast(_Appends, self.store).append(self._roll, f"{self.label}:{member},")

    def arrive(self, member: int, listed: bool = True) -> int:
        """Count ``member`` in (and list it, unless a neighbour's ``note`` did): two or three
        requests, one more for the last member; the count so far."""
        if listed:
            self.note(member)
        count = self.store.add(f"{self.prefix}/n", 1)
        if count == self.size:
            self.store.set(f"{self.prefix}/all", "1")
        return count

    def complete(self) -> bool:
        return self.store.add(f"{self.prefix}/n", 0) >= self.size

    def wait(self, seconds: float, first: float = _FIRST_POLL) -> bool:
        """Whether every member arrived within ``seconds``, reading the counter ever less often
        from ``first`` seconds on (a store ``wait`` that times out prints torch's warnings: this is
        for short waits)."""
        deadline = time.monotonic() + seconds
        pause = first
        while not self.complete():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(3 * pause, _MAX_POLL)
        return True

    def block(self, seconds: float) -> bool:
        """``wait`` as ONE request that the store answers when the count completes (long waits)."""
        try:
            self.store.wait([f"{self.prefix}/all"], datetime.timedelta(seconds=max(seconds, 0.001)))
        except RuntimeError:  # torch's DistStoreError: the wait timed out
            return self.complete()
        return True

    def missing(self, seconds: float, came: Callable[[int], bool] = lambda member: False) -> list[int]:
        """The members that did not arrive: the first member to ask reads the list once and posts
        the answer; the others read that post (waiting at most ``seconds`` for it, then the list).
        ``came``: whether a member is known to have arrived that has not counted in yet."""
        posted = f"{self.prefix}/missing"
        if self.store.add(f"{self.prefix}/diag", 1) == 1:
            absent = self._absent(came)
            self.store.set(posted, ",".join(map(str, absent)))
            return absent
        try:
            self.store.wait([posted], datetime.timedelta(seconds=seconds))
        except RuntimeError:  # the first member is gone before it posted: read the list here
            return self._absent(came)
        text = read1(self.store, posted) or b""
        return [int(m) for m in text.decode().split(",") if m]

    def _absent(self, came: Callable[[int], bool]) -> list[int]:
        entries = (e.partition(":") for e in (read1(self.store, self._roll) or b"").decode().split(",") if e)
        listed = {int(member) for label, _, member in entries if label in self.accept}
        return [m for m in range(self.size) if m not in listed and not came(m)]
