"""Crossed calls: ranks that wait in collectives which can never pair.

gloo pairs messages by the kind of collective and its order: a rank in a tensor all_reduce
and a peer in another collective at the same point (an all_reduce of a Python number, an
all_gather) never exchange a byte, and each would wait for the whole timeout. So a wait that
has lasted ``POST_AFTER`` posts what it waits in under the group's call number: one append of
its line, one add to a counter that holds both the count and the sum of the calls' hashes.
Once every rank posted, each reads the counter; if the hashes differ, every rank reads the
same lines and raises the same ``CollectiveMismatchError``. Calls that do not wait that long
cost nothing; ranks that wait in the same call (a slow one, a late peer) conclude nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, cast

import attrs
import torch
from torch._C._distributed_c10d import Store

from ._pulse import read1
from ._tally import Tally
from ._verdict import Request, bounded

if TYPE_CHECKING:
    from ._comm import NativeComm

#: what a wait in the all-to-all of Python numbers (``_records``) is called in reports and stall marks
NUMBERS = "all_reduce (Python numbers)"
#: how long a wait lasts before it posts what it waits in (a matched call rarely waits this long)
POST_AFTER = 1.0
#: how long a rank that concluded waits for the others to conclude before it drops the group
ACK_WAIT = 3.0
_COUNT_BITS = 14
#: groups of this many ranks or more are not watched (the counter's sum must fit in int64)
MAX_RANKS = 1 << _COUNT_BITS
_HASH_BITS = 63 - 2 * _COUNT_BITS


class _Appends(Protocol):
    def append(self, key: str, value: str, /) -> None: ...  # in torch, missing from its stubs


def describe(what: str, tensors: Sequence[torch.Tensor], calling: str | None) -> str:
    """What a rank waits in, in the words of the report: the backend collective and its bytes."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    nbytes = "+".join(map(str, sizes))
    moves = {
        "all_reduce": f"a tensor all_reduce of {nbytes} bytes",
        # its tensors: what it gathers into and its own part (the smallest)
        "all_gather": f"an all_gather of {min(sizes, default=0)} bytes a rank (all_gather, or all_reduce of "
        "Python numbers)",
        NUMBERS: "an all_reduce of a Python number",
        "broadcast": f"a broadcast of {nbytes} bytes",
        "barrier": "a barrier",
    }.get(what, f"{what} of {nbytes} bytes")
    return f"{calling}: {moves}" if calling else moves


def watch(comm: NativeComm, what: str, tensors: Sequence[torch.Tensor]) -> Crossing | None:
    """The watch of ``comm``'s current call (made at its first look), None without a store."""
    seq, crossing, store = comm.lockstep.seq, comm.crossing, comm.guard.store
    if crossing is not None and crossing.seq == seq:
        return crossing
    if store is None or len(comm.ranks) >= MAX_RANKS:
        return None
    if crossing is not None and crossing.posted:  # its call is over here, and so on every rank
        _forget(comm.guard.written, store, crossing.keys)
    prefix = f"crossed/{comm.key}/{seq}.{comm.lockstep.agreed}"
    line = describe(what, tensors, comm.calling)
    comm.crossing = crossing = Crossing(store, prefix, seq, comm.ranks, comm.group_rank, line, comm.guard.written)
    comm.guard.written.extend(f"guard/{key}" for key in crossing.keys)  # deleted at close, else by forget
    return crossing


def _forget(written: list[str], store: Store, keys: Sequence[str]) -> None:
    """Delete a watch's keys now, not only at close: nobody reads them any more."""

    def delete() -> bool:
        for key in keys:
            store.delete_key(key)
        return True

    Request(delete)  # not waited for (a store that does not answer keeps them: it is gone)
    written[:] = [w for w in written if w.removeprefix("guard/") not in keys]


def _hash(line: str) -> int:
    return int.from_bytes(hashlib.blake2b(line.encode(), digest_size=8).digest(), "little") >> (64 - _HASH_BITS)


@attrs.define
class Crossing:
    """One call's watch (a comm keeps the one of its current call)."""

    store: Store
    #: the group's call: its keys' prefix
    prefix: str
    #: the call's number in the group (``LockStep.seq``) and the group's ranks
    seq: int
    ranks: tuple[int, ...]
    group_rank: int
    line: str
    #: the guard's list of the keys to delete at close
    written: list[str] = attrs.Factory(list)
    posted_at: int = -1
    next_read: int = -1
    #: the post or read in flight: the wait never waits for the store, it collects at a later look
    request: Request[int] | None = None

    @property
    def posted(self) -> bool:
        return self.posted_at >= 0

    @property
    def keys(self) -> tuple[str, str]:
        """The counter and the lines (a conclusion's tally adds its keys to ``written``)."""
        return (f"{self.prefix}/n", f"{self.prefix}/calls")

    def look(self, waited: float, looks: int) -> str | None:
        """At the ``looks``-th look of a wait of ``waited`` seconds: the report when every rank of
        the group waits here and their calls differ, else None. The store requests run in threads
        of their own: a look starts one or collects the last (a slow store never delays the wait)."""
        request = self.request
        if request is not None:
            if not request.done:
                return None
            self.request = None
            return self._judge(request.value)
        if self.posted_at < 0 and waited >= POST_AFTER:
            self.request, self.posted_at, self.next_read = Request(self._post), looks, looks + 1
        elif self.posted and looks >= self.next_read:  # every look at first (a rank that concluded waits)
            self.next_read = looks + 1 + (looks - self.posted_at) // 4
            self.request = Request(lambda: self.store.add(self.keys[0], 0))
        return None

    def conclude(self) -> str | None:
        """Once posted: the report, when every rank posted and the calls differ (a wait that ended
        because a peer concluded first and dropped the group ends here too)."""
        return self._judge(bounded(lambda: self.store.add(self.keys[0], 0), 1.0)) if self.posted else None

    def _judge(self, total: int | None) -> str | None:
        if total is None or total % MAX_RANKS != len(self.ranks):
            return None
        if total >> _COUNT_BITS == len(self.ranks) * _hash(self.line):
            self.next_read = 1 << 62  # every rank waits in this same call: a slow one, not a crossed one
            return None
        said = bounded(lambda: read1(self.store, self.keys[1]), 2.0) or b""
        # every rank concludes before any drops the group: a rank woken by a dropped group would
        # have to read the store, which may leave with the rank that hosts it
        seen = Tally(self.store, f"{self.prefix}/seen", len(self.ranks))
        self.written.extend(f"guard/{key}" for key in seen.keys)  # the group is broken: deleted at close
        bounded(lambda: seen.arrive(self.group_rank, listed=False) and seen.wait(ACK_WAIT), ACK_WAIT + 2.0)
        return report(self.ranks, said.decode("utf-8", "replace"))

    def _post(self) -> int:
        store = self.store
        cast(_Appends, store).append(self.keys[1], f"{self.group_rank}\t{self.line}\n")
        return store.add(self.keys[0], (_hash(self.line) << _COUNT_BITS) + 1)


def report(ranks: Sequence[int], said: str) -> str:
    """The text every rank raises: each rank's call, in rank order (the same on every rank)."""
    lines: dict[int, str] = {}
    for entry in said.splitlines():
        member, _, line = entry.partition("\t")
        if member.isdigit() and int(member) < len(ranks):
            lines[int(member)] = line
    table = "\n".join(f"  rank {ranks[m]}: {lines[m]}" for m in sorted(lines))
    return (
        f"the ranks wait in different collectives, which can never pair:\n{table}\n"
        "every rank must make the same calls in the same order, with the same kind of value "
        "(a tensor on every rank, or a Python number on every rank); checked mode (IDIST_CHECKED=1) "
        "names the difference before any data moves"
    )
