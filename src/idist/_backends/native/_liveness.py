"""Liveness: each rank's heartbeat on the rendezvous store, watched by a daemon thread.

A rank beats through a store connection of its own (a call on a store cut off by a partition
hangs, and must not hold the context's). A collective that is still waiting after a slice
asks ``lost(ranks)``: the ranks whose heartbeat did not change over ``limit`` seconds of
rounds this watcher completed (a starved watcher judges nobody), or, when its own store call
hangs or keeps failing past ``limit``, the ranks of node 0, which serves the store. A rank
that computes for hours keeps beating: only a dead process, node or link goes silent. A rank
blocked in torch's own collectives (DDP, FSDP) is ended by the watcher (``Stuck``).
See docs/failures.md, "Liveness".
"""

from __future__ import annotations

import atexit
import math
import os
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Mapping, Sequence
from typing import cast

import attrs
from torch._C._distributed_c10d import Store

from ..._errors import LaunchEnvironmentError
from ..._launch_env import LaunchInfo

#: seconds of silence after which a peer is lost, unless the option or the variable says
DEFAULT_LIMIT = 30.0
LIVENESS_VAR = "IDIST_LIVENESS"
#: how long closing (or exiting) waits for the watcher's store call in flight
STOP_SECONDS = 1.0


def limit_from(value: float | None, env: Mapping[str, str]) -> float:
    """The limit in seconds (0: liveness off) from ``liveness=``, else ``IDIST_LIVENESS``, else 30."""
    if value is None:
        text = env.get(LIVENESS_VAR, "").strip()
        if not text:
            return DEFAULT_LIMIT
        try:
            value = float(text)
        except ValueError:
            raise LaunchEnvironmentError(
                f"{LIVENESS_VAR}={text!r} is not a number of seconds (0 turns liveness off)"
            ) from None
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"liveness must be a number of seconds >= 0 (0 turns it off), got {value!r}")
    return float(value)


def interval_for(limit: float) -> float:
    """Seconds between two heartbeats (and between two looks of a waiting collective)."""
    return min(1.0, max(0.05, limit / 10))


@attrs.frozen
class Lost:
    """What the watcher found: ranks of a group that stopped answering, and why, in words."""

    ranks: tuple[int, ...]
    why: str


@attrs.define(eq=False)
class Heartbeat:
    """This rank's heartbeat and its view of every other rank's (one per context)."""

    store: Store
    rank: int
    world_size: int
    limit: float
    #: the ranks on node 0, which serves the store (named when the store stops answering)
    store_ranks: tuple[int, ...]
    prefix: str = "idist/live"
    interval: float = attrs.field(init=False)
    _beats: int = 0
    #: every rank's last heartbeat value and when a completed round first saw it (None: not seen)
    _values: list[bytes | None] = attrs.field(init=False)
    _seen: list[float] = attrs.field(init=False)
    _all_present: bool = False
    _last_ok: float = attrs.field(init=False, factory=time.monotonic)
    _pending: float | None = None
    _failures: int = 0
    _stop: threading.Event = attrs.field(init=False, factory=threading.Event)
    _thread: threading.Thread | None = None

    def __attrs_post_init__(self) -> None:
        self.interval = interval_for(self.limit)
        self._values = [None] * self.world_size
        self._seen = [0.0] * self.world_size

    @property
    def keys(self) -> list[str]:
        return [f"{self.prefix}/{r}" for r in range(self.world_size)]

    def beat(self) -> None:
        """One heartbeat now (also before the watcher starts: peers wait for every rank's first)."""
        self._beats += 1
        self.store.set(f"{self.prefix}/{self.rank}", str(self._beats))

    def start(self) -> None:
        self._thread = threading.Thread(
            target=_watch, args=(weakref.ref(self), self._stop, self.interval), name="idist-liveness", daemon=True
        )
        self._thread.start()
        _RUNNING.add(self)

    def stop(self) -> None:
        """End the watcher; waits at most ``STOP_SECONDS`` for a store call in flight."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(STOP_SECONDS)
        _RUNNING.discard(self)

    def _round(self) -> None:
        keys = self.keys
        self._pending = time.monotonic()
        try:
            self.beat()
            if not self._all_present:
                self._all_present = self.store.check(keys)
            values = self.store.multi_get(keys) if self._all_present else None
        except Exception:  # a store that fails or is gone is what this watches for
            self._failures += 1
            return
        finally:
            self._pending = None
        now = time.monotonic()
        self._last_ok, self._failures = now, 0
        if values is None:
            return  # judge nobody before every rank has beaten once
        for r, value in enumerate(values):
            if value != self._values[r]:
                self._values[r], self._seen[r] = value, now

    def lost(self, ranks: Sequence[int]) -> Lost | None:
        """The ranks of ``ranks`` that stopped answering, or None (called by a waiting collective)."""
        now = time.monotonic()
        quiet = now - self._last_ok
        pending = self._pending
        hung = pending is not None and now - pending > self.limit / 2
        if quiet > self.limit and (hung or self._failures >= 2):
            gone = tuple(r for r in self.store_ranks if r in ranks and r != self.rank)
            return Lost(gone, f"the rendezvous store on node 0 did not answer for {quiet:.1f}s")
        last = self._last_ok
        quiet_for = {r: last - self._seen[r] for r in ranks if r != self.rank and self._values[r] is not None}
        silent = tuple(r for r, seconds in quiet_for.items() if seconds > self.limit)
        if not silent:
            return None
        longest = max(quiet_for[r] for r in silent)
        return Lost(silent, f"no heartbeat from them for {longest:.1f}s, liveness limit {self.limit:g}s")


def attempt(env: Mapping[str, str]) -> str:
    """This launch attempt's namespace in the store (torchrun's agent keeps its store across restarts)."""
    return env.get("TORCHELASTIC_RESTART_COUNT", "0")


def heartbeat(store: Store | None, info: LaunchInfo, limit: float) -> Heartbeat | None:
    """This rank's heartbeat, beaten once (None when liveness is off or there is nothing to watch),
    on a store connection of its own: a call on a store cut off by a partition never returns."""
    t = info.topology
    if store is None or limit <= 0 or t.world_size < 2:
        return None
    clone = getattr(store, "clone", None)  # Store.clone is missing from torch's stubs
    try:
        own = cast(Store, clone()) if clone is not None else store
    except RuntimeError:  # a store without connections (an in-memory one) cannot hang: share it
        own = store
    beat = Heartbeat(
        own, t.rank, t.world_size, limit, tuple(range(t.nproc_per_node)), prefix=f"idist/live/{attempt(os.environ)}"
    )
    beat.beat()
    return beat


def _watch(ref: weakref.ref[Heartbeat], stop: threading.Event, interval: float) -> None:
    """The watcher thread: it ends when its heartbeat is stopped, or dropped with its context
    (an adopted context is never closed)."""
    stuck = Stuck()
    while not stop.wait(interval):
        heartbeat = ref()
        if heartbeat is None:
            return
        heartbeat._round()
        stuck.look(heartbeat)
        del heartbeat


_RUNNING: weakref.WeakSet[Heartbeat] = weakref.WeakSet()

#: where torch's own collectives wait (DDP's gradient all_reduce runs inside backward)
_TORCH_WAITS = tuple(os.path.join("torch", d, "") for d in ("distributed", "autograd", os.path.join("nn", "parallel")))


@attrs.define
class Stuck:
    """A rank blocked inside torch's own collectives (DDP, FSDP, checkpoints) never asks ``lost``,
    and gloo cannot be woken from Python. When a peer is lost and the main thread has stayed on
    one line of torch.distributed / autograd for ``SETTLE`` seconds, the watcher says so on
    stderr, with the main thread's stack, and ends the process with status 1."""

    SETTLE = 2.0
    _at: tuple[object, int] | None = None
    _since: float = 0.0

    def look(self, heartbeat: Heartbeat) -> None:
        frame = sys._current_frames().get(threading.main_thread().ident or -1)
        where = (frame.f_code, frame.f_lineno) if frame is not None else None
        if frame is None or not any(d in frame.f_code.co_filename for d in _TORCH_WAITS):
            self._at = None
            return
        now = time.monotonic()
        if where != self._at:
            self._at, self._since = where, now
            return
        lost = heartbeat.lost(range(heartbeat.world_size))
        if lost is None or now - self._since < self.SETTLE:
            return
        stack = "".join(traceback.format_stack(frame))
        message = (
            f"Traceback of rank {heartbeat.rank}'s main thread (most recent call last):\n{stack}"
            f"idist.PeerLostError: ranks {list(lost.ranks)} stopped answering ({lost.why}) while rank "
            f"{heartbeat.rank} waits in torch's own collective above, which cannot be interrupted; the group is "
            "lost: exiting with status 1\n"
        )
        os.write(2, message.encode(errors="replace"))
        os._exit(1)


@atexit.register
def _stop_all() -> None:
    # A store call that returns while the interpreter finalizes ends the thread inside torch's
    # binding, which aborts the process: let every call in flight return first.
    for heartbeat in list(_RUNNING):
        heartbeat.stop()
