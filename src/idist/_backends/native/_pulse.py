"""The store side of liveness: one beat per node, one monitor, one record of the lost ranks.

Each node's *speaker* (its lowest local rank that is alive) adds 1 to the node's key every
interval. The speaker of the node that serves the store is the *monitor*: instead of beating it
reads every node's key in one ``multi_get`` and finds the nodes whose count stopped. What is
lost lives in one record key (a line per lost node or rank); whoever changes it (the monitor for
nodes, a speaker for its own node's ranks) then adds ``PUSH`` to every node's key, so each
speaker learns of the change from the answer to its next beat, and its node's ranks read the
record once. In steady state: one request per node per interval. See docs/scale.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import attrs
from torch._C._distributed_c10d import Store

from ..._topology import Topology
from ._board import FAILS, OK, PENDING, VERSION, NodeBoard

R = TypeVar("R")

#: what ``add`` on a node's key counts in its low 32 bits (beats) and above (record changes)
PUSH = 1 << 32
BEATS = PUSH - 1
#: rounds a speaker looks for the node that serves the store before node 0 watches the nodes
FIND_ROUNDS = 10
#: what ``compare_set`` gets back for a key that does not exist (``read1``)
_ABSENT = "\x00idist-absent"


def read1(store: Store, key: str) -> bytes | None:
    """``key``'s value in ONE request (torch's ``get`` is a wait and a get), None when absent:
    a ``compare_set`` that expects a value nobody writes changes nothing and returns the value."""
    value = bytes(store.compare_set(key, _ABSENT, _ABSENT))
    return None if value == _ABSENT.encode() else value


@attrs.frozen
class Entry:
    """A lost node (tag ``nN``) or rank (``rR``): its ranks, and how long it was silent when found."""

    ranks: tuple[int, ...]
    seconds: float


def parse(text: bytes | None) -> dict[str, Entry]:
    out: dict[str, Entry] = {}
    for line in (text or b"").decode("ascii", "replace").splitlines():
        parts = line.split(" ")
        try:
            out[parts[0]] = Entry(tuple(int(r) for r in parts[2].split(",") if r), float(parts[1]))
        except (IndexError, ValueError):
            continue  # a line this version cannot read names nobody
    return out


def render(entries: Mapping[str, Entry]) -> bytes:
    lines = (f"{tag} {e.seconds:.1f} {','.join(map(str, e.ranks))}" for tag, e in sorted(entries.items()))
    return "\n".join(lines).encode()


def update(store: Store, key: str, mine: Callable[[str], bool], wanted: Mapping[str, Entry]) -> tuple[bool, bytes]:
    """Make the record's entries for which ``mine(tag)`` holds exactly ``wanted`` (compare-and-set
    until no other writer came between); whether it changed, and the record now."""
    current = read1(store, key)
    while True:
        entries = parse(current)
        new = {tag: e for tag, e in entries.items() if not mine(tag)}
        for tag, e in wanted.items():
            new[tag] = entries.get(tag, e)
        text = render(new)
        if text == (current or b""):
            return False, text
        got = bytes(store.compare_set(key, (current or b"").decode(), text.decode()))
        if got == text:
            return True, text
        current = got


@attrs.define(eq=False)
class Counts:
    """What a monitor saw of the node keys: each node's beat count and when a completed round
    first saw it (a node that never beat is not judged)."""

    limit: float
    beats: list[int]
    seen: list[float]
    last_round: float = 0.0

    @classmethod
    def for_nodes(cls, nnodes: int, limit: float) -> Counts:
        return cls(limit, [0] * nnodes, [0.0] * nnodes)

    def round(self, values: Sequence[bytes], now: float) -> None:
        """Take the values one round read (``now``: when it completed)."""
        # a round after a long gap (a starved thread, a store that stalled) judges nobody
        fresh = now - self.last_round > self.limit / 2
        self.last_round = now
        for n, value in enumerate(values):
            count = int(value) & BEATS
            if count != self.beats[n] or fresh:
                self.beats[n], self.seen[n] = count, now

    def silent(self, skip: int) -> dict[int, float]:
        """Nodes (all but ``skip``) whose count stood still for more than the limit: seconds each."""
        out = {}
        for n, (count, seen) in enumerate(zip(self.beats, self.seen, strict=True)):
            quiet = self.last_round - seen
            if n != skip and count > 0 and quiet > self.limit:
                out[n] = quiet
        return out


def node_key(prefix: str, node: int) -> str:
    return f"{prefix}/n{node}"


def push(store: Store, prefix: str, nnodes: int) -> None:
    """Tell every node's speaker that the record changed (it sees it in its next beat's answer)."""
    for n in range(nnodes):
        store.add(node_key(prefix, n), PUSH)


class _Failed(Exception):
    """A store call of this round failed (counted on the board; the round ends)."""


@attrs.define(eq=False)
class Pulse:
    """One rank's store calls for liveness (on its own thread: a call may never return)."""

    store: Store
    topology: Topology
    limit: float
    #: where this context's liveness keys live in the store
    prefix: str
    board: NodeBoard
    #: the node that serves the store, when known from the start (idist's rendezvous: node 0)
    store_node: int | None = None
    #: whether this machine serves the store (None: cannot tell)
    store_here: bool | None = None
    #: the record of lost nodes and ranks as last read, and the version read
    record: dict[str, Entry] = attrs.Factory(dict)
    _read: int = 0
    _counts: Counts | None = None
    _rounds: int = 0
    _fails: int = 0

    def _call(self, fn: Callable[..., R], *args: object) -> R:
        board = self.board
        board.post(PENDING, time.monotonic())
        try:
            out = fn(*args)
        except Exception:  # a store that fails or is gone is what liveness watches for
            self._fails += 1
            board.post(FAILS, self._fails)
            raise _Failed from None
        finally:
            board.post(PENDING, 0.0)
        board.post(OK, time.monotonic())
        if self._fails:
            self._fails = 0
            board.post(FAILS, 0)
        return out

    def round(self, speaker: bool, quiet: Mapping[int, float]) -> None:
        """One interval's calls, a speaker's only: it beats (the monitor reads every node instead),
        posts its node's silent ranks, and reads the record when its beat says it changed."""
        self._rounds += 1
        t = self.topology
        try:
            if t.nnodes > 1 and speaker:
                self._find_store_node()
                if self._monitor():
                    # its read names every node twice (a wait and a multi_get): with one rank a
                    # node, every other round keeps the store at two keys a rank a second
                    if t.nproc_per_node > 1 or self._rounds % 2 == 0:
                        self._watch_nodes()
                else:
                    version = self._call(self.store.add, node_key(self.prefix, t.node_rank), 1) // PUSH
                    self.board.post(VERSION, version)
                local = {f"r{r}": Entry((r,), q) for r, q in quiet.items()}
                self._tell(lambda tag: tag[0] == "r" and int(tag[1:]) // t.nproc_per_node == t.node_rank, local)
                newest = max(s.version for s in self.board.slots())
                if newest > self._read:
                    self._set(parse(self._call(read1, self.store, f"{self.prefix}/lost")))
                    self._read = newest
        except _Failed:
            pass

    def _set(self, record: dict[str, Entry]) -> None:
        """Take ``record`` as the lost ranks, and copy it to the board for the node's ranks."""
        if record != self.record:
            self.board.post_lost({r: e.seconds for e in record.values() for r in e.ranks})
        self.record = record

    def _find_store_node(self) -> None:
        board, node = self.board, self.topology.node_rank
        if board.store_node >= 0 or self._rounds > FIND_ROUNDS:
            return
        if self.store_node is not None:
            board.store_node = self.store_node
        elif self.store_here:
            self._call(self.store.set, f"{self.prefix}/store", str(node))
            board.store_node = node
        elif (found := self._call(read1, self.store, f"{self.prefix}/store")) is not None:
            board.store_node = int(found)

    def _monitor(self) -> bool:
        """Whether this speaker watches the nodes: its node serves the store (or, where no node
        was found to serve it, it is node 0)."""
        node = self.board.store_node
        if node < 0 and self._rounds > FIND_ROUNDS:
            node = 0
        return node == self.topology.node_rank

    def _watch_nodes(self) -> None:
        t = self.topology
        keys = [node_key(self.prefix, n) for n in range(t.nnodes)]
        if self._counts is None:
            for key in keys:  # every key exists from now on: one multi_get reads them all
                self._call(self.store.add, key, 0)
            self._counts = Counts.for_nodes(t.nnodes, self.limit)
        values = self._call(self.store.multi_get, keys)
        counts = self._counts
        counts.round(values, time.monotonic())
        self.board.post(VERSION, int(values[t.node_rank]) // PUSH)
        nproc = t.nproc_per_node
        silent = counts.silent(skip=t.node_rank)
        wanted = {f"n{n}": Entry(tuple(range(n * nproc, (n + 1) * nproc)), q) for n, q in silent.items()}
        self._tell(lambda tag: tag[0] == "n", wanted)

    def _tell(self, mine: Callable[[str], bool], wanted: dict[str, Entry]) -> None:
        """Make the record's entries ``mine`` selects read ``wanted``, and tell every node."""
        if {tag for tag in self.record if mine(tag)} == set(wanted):
            return
        changed, text = self._call(update, self.store, f"{self.prefix}/lost", mine, wanted)
        self._set(parse(text))
        if changed:
            self._call(push, self.store, self.prefix, self.topology.nnodes)
