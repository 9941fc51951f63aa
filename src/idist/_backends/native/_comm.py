"""``NativeComm``: byte and tensor collectives over one torch ProcessGroup.

It talks to the group object's own methods (``pg.allreduce``...), never to torch's
module-level default group, so several contexts live in one process (simulated ranks in
threads) and a call costs no more than the C++ call itself. A failed call is judged by the
guard (``_failed``, read it top to bottom) and releases this comm's group.
"""

from __future__ import annotations

import datetime
import time
import traceback
from collections.abc import Callable
from typing import Any

import attrs
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import BarrierOptions, BroadcastOptions, Work

from ..._errors import IdistError
from ..._exchange import LockStep
from ..._inplace import divide, plain, resolved, write
from ._crossed import NUMBERS, Crossing, watch
from ._guard import Guard
from ._inflight import FAILED_SECONDS, InFlight
from ._liveness import Lost
from ._pg import ALLTOALL, GATHER, REDUCE_OPTIONS, BrokenPG, PGLike, alltoall_options, gather_options, reduce_options
from ._reaper import bury
from ._verdict import Fault, Verdict

#: a wait's slices are a quarter of liveness's interval (a node's ranks, which share one view,
#: all stop within one); the store is asked once an interval whether a peer failed (Guard.look)
SLICES_PER_LOOK = 4
#: a wait's first slice: after it, a peer that failed before communicating learns that this rank waits
FIRST_LOOK = datetime.timedelta(seconds=0.1)


@attrs.define(eq=False)
class NativeComm:
    """Byte and tensor collectives over one torch ProcessGroup."""

    pg: PGLike
    ranks: tuple[int, ...]
    group_rank: int
    #: failure verdicts, checked mode and section timeouts (its store is None when adopted without one)
    guard: Guard
    #: where tensors must live for this backend (cuda for nccl), None for anywhere
    stage: torch.device | None = None
    #: slot, broadcast guesses, collective and agreement counters (see ``LockStep``)
    lockstep: LockStep = attrs.Factory(LockStep)
    scratch: dict[str, torch.Tensor] = attrs.Factory(dict)
    #: this group's namespace in the store (see _guard)
    key: str = "world"
    #: gather straight into one flat buffer (``_allgather_base``: one copy less); not on mpi
    flat: bool = True
    #: tensors the group's worker threads may still hold (see _inflight)
    inflight: InFlight = attrs.Factory(InFlight)
    #: how long a wait lasts before it asks the liveness watcher about the peers (None: one wait)
    slice: datetime.timedelta | None = None
    #: ``pg`` is torch's default group and this comm's context created it (released: destroyed)
    default_group: bool = False
    #: the torch ProcessGroup built around ``pg`` for DDP (an in-process context's; see _ddp)
    torch_group: dist.ProcessGroup | None = None
    #: collectives of this comm running now (on any thread): its group cannot be destroyed
    busy: int = 0
    #: the user's call its collectives serve now, when named otherwise (checked mode's comparison,
    #: nccl's barrier): what a failure and the stall mark name
    calling: str | None = None
    #: the watch for crossed calls of the call now waiting long (see ``_crossed``), else of an earlier one
    crossing: Crossing | None = None

    @property
    def confirms(self) -> bool:
        """Checked mode pays one more round for a pickle some ranks cannot load (``_exchange.confirmed``)."""
        return self.guard.checked

    def _mark(self, what: str | None) -> None:
        """Count this backend call; with stall marks on, note it (None: that it returned) for the launcher."""
        step = self.lockstep
        step.seq += 0 if what is None else 1
        marks = self.guard.marks
        if marks is not None:
            marks.write(step.seq, None if what is None else self.calling or what, self.key, self.ranks)

    def _call(
        self, what: str, tensors: tuple[torch.Tensor, ...], start: Callable[..., Work | tuple[Work, Work]], *args: Any
    ) -> None:
        """Run ``start(*args)`` (one work, or two started together) and wait for it, holding
        ``tensors`` while the backend may use them; a failure raises what ``_failed`` decides.
        The one-tensor calls pass the group's method and its arguments, not a closure (the hot path)."""
        self._mark(what)
        inflight = self.inflight
        counts = inflight.before(tensors)
        began = time.monotonic()
        lost: Lost | str | None = None
        failure: RuntimeError | None = None
        done = False
        self.busy += 1
        try:
            started = start(*args)
            if self.slice is None and not isinstance(started, tuple):
                started.wait()
            else:
                lost = self._finish_all(started, what, tensors, began)
            done = lost is None
        except RuntimeError as exc:
            failure = exc
        finally:
            inflight.after(tensors, counts, not done)
            self.busy -= 1
        if not done:
            del start, args  # they reach the group, whose connections the failure closes
            raise self._failed(what, failure, lost, began) from failure
        self._mark(None)

    def _finish_all(
        self, started: Work | tuple[Work, Work], what: str, tensors: tuple[torch.Tensor, ...], began: float
    ) -> Lost | str | None:
        for work in started if isinstance(started, tuple) else (started,):
            if (lost := self._finish(work, what, tensors, began)) is not None:
                return lost
        return None

    def _finish(self, work: Work, what: str, tensors: tuple[torch.Tensor, ...], began: float) -> Lost | str | None:
        """Wait for ``work`` (raising the backend's error) in slices, the first one short: between
        two, the liveness watcher says whether it lost a rank of this group (which ends the wait,
        the work in flight). Once an interval, the guard tells a peer that failed before
        communicating at this call that this rank is in it (``Guard.look``: that peer then breaks
        the group), and a long wait finds whether the ranks wait in different collectives (the
        report, a str: ``_crossed``)."""
        slice = self.slice
        if slice is None:
            work.wait()
            return None
        wait = min(slice, FIRST_LOOK)
        looks = 0
        while True:
            try:
                work.wait(wait)
                return None
            except RuntimeError:
                if work.is_completed():  # it failed: the wait below raises the backend's error
                    break
            if (lost := self.guard.lost(self.ranks)) is not None:
                return lost
            if looks % SLICES_PER_LOOK == 0:  # the store once an interval; the watcher every slice
                self.guard.look(self)
                crossed = watch(self, what, tensors)
                if crossed is not None and (said := crossed.look(time.monotonic() - began, looks)) is not None:
                    return said
            looks += 1
            wait = slice
        work.wait()
        return None

    def _failed(self, call: str, exc: RuntimeError | None, lost: Lost | str | None, began: float) -> IdistError:
        """What a failed collective raises, top to bottom: the guard judges the failure; this comm
        counts this rank in, then releases its group (closed connections wake every peer blocked on
        this rank, which then counts itself in); the guard hears who else arrived; the group is
        broken."""
        if exc is not None:
            traceback.clear_frames(exc.__traceback__)  # their work objects hold the group's connections
        call = self.calling or call
        guard = self.guard
        if isinstance(lost, str):  # every rank waits in another collective: each read the same report
            return self._crossed(call, lost)
        # woken by a peer's failure: what liveness knows (a store cut off) needs no store call
        known = lost if lost is not None or exc is None else guard.lost(self.ranks)
        verdict = guard.judge(self, call, exc, known, time.monotonic() - began)
        tell = known is None and verdict.fault is not Fault.BROKEN
        tallies = guard.count_in(self) if tell else None  # before the release that wakes the peers
        crossing = self.crossing  # posted by this wait: a peer that found the crossing first dropped the group
        if lost is None and crossing is not None and crossing.seq == self.lockstep.seq:
            if (said := crossing.conclude()) is not None:
                return self._crossed(call, said)
        self.release(verdict.reason, stuck=lost is not None)
        if tell:
            verdict = guard.report(self, verdict, tallies)
        guard.broken = guard.broken or verdict.reason
        return verdict.error()

    def _crossed(self, call: str, said: str) -> IdistError:
        verdict = Verdict(call, self.ranks, Fault.MISMATCH, why=said)
        self.release(verdict.reason, stuck=True)
        self.guard.broken = self.guard.broken or verdict.reason
        return verdict.error()

    def release(self, reason: str, stuck: bool = False) -> None:
        """Drop this comm's process group: every later call raises ``reason``. Its connections
        close here, unless a collective still runs in the backend (``stuck``, or on another
        thread): destroying the group would wait for that, so a daemon thread does it later."""
        pg = self.pg
        if isinstance(pg, BrokenPG):
            return
        self.pg = BrokenPG(reason)
        self.torch_group = None
        if self.default_group and dist.is_initialized() and dist.group.WORLD is pg:
            dist.destroy_process_group()
        if not (stuck or self.busy):
            self.inflight.drain(FAILED_SECONDS)
            if not self.inflight.held:
                return  # ``pg``'s last reference goes with this frame: destroyed now
        bury(pg, self.inflight, lambda: self.busy > 0)
        self.inflight = InFlight()

    def _timeout(self) -> datetime.timedelta | None:
        sections = self.guard.sections
        return sections[-1] if sections else None

    def allgather_bytes(self, buf: torch.Tensor) -> torch.Tensor:
        n = len(self.ranks)
        if self.stage is not None:
            buf = buf.to(self.stage)
        out = torch.empty(n * buf.numel(), dtype=torch.uint8, device=buf.device)
        sections = self.guard.sections
        opts = gather_options(sections[-1]) if sections else GATHER
        if self.flat:
            self._call("all_gather", (out, buf), self.pg._allgather_base, out, buf, opts)
        else:
            chunks = out.chunk(n)
            self._call("all_gather", (buf, *chunks), self.pg.allgather, [list(chunks)], [buf], opts)
        return out if self.stage is None else out.cpu()

    def alltoall_bytes(self, out: torch.Tensor, buf: torch.Tensor) -> None:
        """Equal parts of CPU ``buf`` to every rank: part r of ``out`` is what group rank r sent here."""
        if self.stage is not None:
            work, got = buf.to(self.stage), torch.empty_like(out, device=self.stage)
        else:
            work, got = buf, out
        sections = self.guard.sections
        opts = alltoall_options(sections[-1]) if sections else ALLTOALL
        self._call(NUMBERS, (got, work), self.pg.alltoall_base, got, work, [], [], opts)
        if got is not out:
            out.copy_(got)

    def broadcast_bytes(self, buf: torch.Tensor, src: int) -> None:
        self.broadcast(buf, src)

    def _broadcast_options(self, src: int) -> BroadcastOptions:
        opts = BroadcastOptions()
        opts.rootRank = src
        timeout = self._timeout()
        if timeout is not None:
            opts.timeout = timeout
        return opts

    def broadcast(self, t: torch.Tensor, src: int) -> None:
        """In place from group rank ``src``; src's ``t`` is only read (a copy goes out when ``t``
        cannot be sent as it is), a receiver's is written as ``_inplace`` writes."""
        opts = self._broadcast_options(src)
        if self._direct(t):
            self._call("broadcast", (t,), self.pg.broadcast, [t], opts)
            return
        work = self._stage(t)
        self._call("broadcast", (work,), self.pg.broadcast, [work], opts)
        if src != self.group_rank:
            write(t, work)

    def broadcast_pair(self, head: torch.Tensor, data: torch.Tensor, src: int) -> None:
        """Both broadcasts start before either is waited for: the data does not wait for the header."""
        opts = self._broadcast_options(src)
        pg = self.pg
        self._call("broadcast", (head, data), lambda: (pg.broadcast([head], opts), pg.broadcast([data], opts)))

    def allreduce(self, t: torch.Tensor, op: str, divisor: int = 0) -> None:
        """In place; with ``divisor``, the result divided by it (AVERAGE as SUM): a staged tensor
        is divided before it is written back, so ``t`` never holds the sum once this returns."""
        sections = self.guard.sections
        opts = reduce_options(op, sections[-1]) if sections else REDUCE_OPTIONS[op]
        # _direct, inlined: the hot path
        if self.stage is None and t.is_contiguous() and not (t.is_conj() or t.is_neg()):
            self._call("all_reduce", (t,), self.pg.allreduce, [t], opts)
            if divisor > 1:  # x / 1 is x, but would quiet a signalling NaN that serial keeps
                divide(t, divisor)
            return
        work = self._stage(t)
        self._call("all_reduce", (work,), self.pg.allreduce, [work], opts)
        if divisor > 1:
            work.div_(divisor)
        write(t, work)

    def barrier(self) -> None:
        opts = BarrierOptions()
        timeout = self._timeout()
        if timeout is not None:
            opts.timeout = timeout
        self._call("barrier", (), self.pg.barrier, opts)

    def _direct(self, t: torch.Tensor) -> bool:
        """Whether the backend can use ``t`` as it is: on this comm's device, contiguous, plain."""
        stage = self.stage
        return (stage is None or t.device == stage) and t.is_contiguous() and plain(t)

    def _stage(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of ``t`` the backend can use (``_direct``); the input stays the result (``write``)."""
        stage = self.stage
        work = resolved(t.to(stage) if stage is not None else t)
        return work.contiguous() if work is not t else work.clone(memory_format=torch.contiguous_format)
