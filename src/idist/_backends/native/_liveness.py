"""Liveness: which peers stopped answering, at O(1) store requests per rank.

A node's ranks watch each other on the node board (``_board``: shared memory, no store
request); each node's speaker beats once per interval on the store, and the monitor on the
store's node reads every beat at once (``_pulse``). Two daemon threads per rank: the watcher
never calls the store (it ticks, reads the board, and looks at a main thread stuck in torch's
own collectives: ``_stuck``); the store thread makes this rank's store calls, so a call that
never returns is itself the signal: one in flight for half the limit, with none answered for
the limit, names the store's node. A rank that computes for hours keeps ticking: only a dead
process, node or link goes silent. See docs/failures.md "Liveness" and docs/scale.md.
"""

from __future__ import annotations

import atexit
import random
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import cast

import attrs
from torch._C._distributed_c10d import Store

from ..._launch_env import LaunchInfo
from ..._topology import Topology
from ._board import OK, TICK, NodeBoard, Slot
from ._keys import address, served_here
from ._pulse import Pulse, node_key
from ._stuck import Stuck

#: how long closing (or exiting) waits for a store call in flight
STOP_SECONDS = 1.0


def interval_for(limit: float) -> float:
    """Seconds between two beats (and two looks of the watcher, and of a waiting collective)."""
    return min(1.0, max(0.05, limit / 10))


@attrs.frozen
class Lost:
    """What the watcher found: ranks of a group that stopped answering, and why, in words."""

    ranks: tuple[int, ...]
    why: str


@attrs.define(eq=False)
class Heartbeat:
    """This rank's part of liveness (one per context): its board slot, its store calls, its view."""

    pulse: Pulse
    #: the store's address ("HOST:PORT"), named when it stops answering
    where: str
    #: look at the main thread (``Stuck``); off for the simulated ranks of a benchmark
    watch_main: bool = True
    _stuck: Stuck = attrs.Factory(Stuck)
    interval: float = attrs.field(init=False)
    _ticks: int = 0
    #: each local rank's last tick and when this watcher first saw it
    _seen: list[tuple[int, float]] = attrs.field(init=False)
    _last_look: float = attrs.field(init=False, factory=time.monotonic)
    #: local ranks silent for more than the limit (global rank -> seconds), from the last look
    _quiet: dict[int, float] = attrs.Factory(dict)
    _speaker: bool = False
    #: set when stopped: nobody was lost and the store answered (its keys may then be deleted)
    clean: bool = False
    _stop: threading.Event = attrs.field(init=False, factory=threading.Event)
    _threads: list[threading.Thread] = attrs.Factory(list)

    def __attrs_post_init__(self) -> None:
        self.interval = interval_for(self.limit)
        self._seen = [(0, 0.0)] * self.topology.nproc_per_node

    @property
    def topology(self) -> Topology:
        return self.pulse.topology

    @property
    def limit(self) -> float:
        return self.pulse.limit

    @property
    def board(self) -> NodeBoard:
        return self.pulse.board

    # ----------------------------------------------------------------- threads
    def start(self, threads: bool = True) -> None:
        """Tick once now (a rank stopped right after its context was made is still seen once),
        then start the watcher and the store thread (``threads=False``: the caller calls ``tick``
        every interval instead, as benchmarks/bench_scale.py does for thousands of ranks)."""
        self._ticks = 1
        self.board.post(TICK, 1)
        ref = weakref.ref(self)
        for name, body in (("idist-liveness", Heartbeat._look), ("idist-liveness-store", Heartbeat._round)):
            if threads:
                thread = threading.Thread(
                    target=_loop, args=(ref, body, self._stop, self.interval), name=name, daemon=True
                )
                thread.start()
                self._threads.append(thread)
        _RUNNING.add(self)

    def tick(self) -> None:
        """What both threads do in one interval, in turn (for a heartbeat started without them)."""
        self._look()
        self._round()

    def stop(self) -> None:
        """End both threads; waits at most ``STOP_SECONDS`` for a store call in flight (once)."""
        if self not in _RUNNING:
            return
        self._stop.set()
        deadline = time.monotonic() + STOP_SECONDS
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        self.clean = self.lost(range(self.topology.world_size)) is None
        self.board.close(unmap=not any(t.is_alive() for t in self._threads))
        _RUNNING.discard(self)

    # ----------------------------------------------- the watcher (never the store)
    def _look(self) -> None:
        now = time.monotonic()
        starved = now - self._last_look > self.limit / 2  # a starved watcher judges nobody
        self._last_look = now
        self._ticks += 1
        board = self.board
        board.post(TICK, self._ticks)
        t = self.topology
        base = t.node_rank * t.nproc_per_node
        quiet: dict[int, float] = {}
        speaker = True
        for j, slot in enumerate(board.slots()):
            if j == t.local_rank:
                continue
            tick, seen = self._seen[j]
            if slot.tick != tick or starved:
                tick, seen = self._seen[j] = (slot.tick, now)
            if tick == 0:
                continue  # never ticked: not started yet, judged by nobody
            if j < t.local_rank and now - seen <= self.limit / 2:
                speaker = False  # a lower local rank speaks for the node
            if now - seen > self.limit:
                quiet[base + j] = now - seen
        self._quiet, self._speaker = quiet, speaker
        if self.watch_main:
            self._stuck.look(self)

    def _round(self) -> None:
        self.pulse.round(self._speaker, self._quiet)

    # ---------------------------------------------------------- what collectives ask
    def lost(self, ranks: Sequence[int]) -> Lost | None:
        """The ranks of ``ranks`` that stopped answering, or None (asked by a waiting collective
        and by the watcher; reads this process's view and the board, never the store)."""
        me = self.topology.rank
        others = [r for r in ranks if r != me]
        now = time.monotonic()
        nproc, node = self.topology.nproc_per_node, self.topology.node_rank
        if any(r // nproc != node for r in others):
            quiet = _store_quiet(self.board.slots(), now, self.limit)
            if quiet is not None:
                served = self.board.store_node
                gone = tuple(r for r in others if served >= 0 and r // nproc == served)
                at = f" at {self.where}" if self.where else ""
                return Lost(gone, f"the store{at} stopped answering for {quiet:.1f}s")
        silent = self.board.lost()  # the record, as the node's speaker copied it
        silent.update(self._quiet)
        hit = tuple(r for r in others if r in silent)
        if not hit:
            return None
        longest = max(silent[r] for r in hit)
        return Lost(hit, f"no heartbeat from them for {longest:.1f}s, liveness limit {self.limit:g}s")

    @property
    def keys(self) -> list[str]:
        """Every key this heartbeat's context may have written, relative to its prefix."""
        return [*(f"n{n}" for n in range(self.topology.nnodes)), "lost", "token", "store"]

    @property
    def store_ranks(self) -> tuple[int, ...]:
        """The ranks on the node that serves the store (() while it is not known)."""
        node = self.board.store_node
        nproc = self.topology.nproc_per_node
        return tuple(range(node * nproc, (node + 1) * nproc)) if node >= 0 else ()


def _store_quiet(slots: Sequence[Slot], now: float, limit: float) -> float | None:
    """Seconds since a store call of this node answered, when that is over the limit while one
    has been in flight for half of it (or keeps failing); else None."""
    ok = max(s.ok for s in slots)
    if ok <= 0 or now - ok <= limit:
        return None
    hung = any(s.pending > 0 and now - s.pending > limit / 2 for s in slots)
    return now - ok if hung or any(s.fails >= 2 for s in slots) else None


def _loop(ref: weakref.ref[Heartbeat], body: Callable[[Heartbeat], None], stop: threading.Event, every: float) -> None:
    """A liveness thread: it ends when its heartbeat is stopped, or dropped with its context
    (an adopted context is never closed)."""
    # the first round at a random point of the interval: the ranks of a job start together,
    # and their store calls would otherwise come in one burst every interval
    first = random.uniform(0.0, every)
    while not stop.wait(first or every):
        first = 0.0
        heartbeat = ref()
        if heartbeat is None:
            return
        body(heartbeat)
        del heartbeat


def heartbeat(
    store: Store | None,
    info: LaunchInfo,
    limit: float,
    *,
    prefix: str,
    store_node: int | None = None,
    watch_main: bool = True,
) -> Heartbeat | None:
    """This rank's heartbeat, not started (None when liveness is off or there is nothing to
    watch), on a store connection of its own: a call on a store cut off by a partition never
    returns, and must not hold the context's. ``prefix``: the context's liveness keys."""
    t = info.topology
    if store is None or limit <= 0 or t.world_size < 2:
        return None
    clone = getattr(store, "clone", None)  # Store.clone is missing from torch's stubs
    try:
        own = cast(Store, clone()) if clone is not None else store
    except RuntimeError:  # a store without connections (an in-memory one) cannot hang: share it
        own = store
    # the node's ranks find their board by a name every rank of this context agrees on
    token = bytes(own.compare_set(f"{prefix}/token", "", secrets.token_hex(8))).decode()
    board = NodeBoard.open(token, t.node_rank, t.nproc_per_node, t.local_rank, t.world_size)
    if t.nnodes > 1:  # the node's first beat, before its context exists: a node cut off at once is seen once
        own.add(node_key(prefix, t.node_rank), 1)
    board.post(OK, time.monotonic())  # the store answered: silence from now on counts
    at = address(store)
    here = served_here(at[0]) if at is not None else None
    where = f"{at[0]}:{at[1]}" if at is not None else ""
    return Heartbeat(Pulse(own, t, limit, prefix, board, store_node, here), where, watch_main)


_RUNNING: weakref.WeakSet[Heartbeat] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    # A store call that returns while the interpreter finalizes ends the thread inside torch's
    # binding, which aborts the process: let every call in flight return first.
    for heartbeat in list(_RUNNING):
        heartbeat.stop()
