"""``NativeComm``: byte and tensor collectives over one torch ProcessGroup.

It talks to the group object's own methods (``pg.allreduce``...), never to torch's
module-level default group, so several contexts live in one process (simulated ranks in
threads) and a call costs no more than the C++ call itself.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions, AllreduceOptions, BarrierOptions, BroadcastOptions, Work

from ..._errors import GroupBrokenError
from ..._exchange import LockStep
from ._guard import Guard
from ._inflight import InFlight

_TORCH_OPS = {
    "SUM": dist.ReduceOp.SUM,
    "PRODUCT": dist.ReduceOp.PRODUCT,
    "MIN": dist.ReduceOp.MIN,
    "MAX": dist.ReduceOp.MAX,
    "AND": dist.ReduceOp.BAND,
    "OR": dist.ReduceOp.BOR,
    "AVERAGE": dist.ReduceOp.AVG,
}


class PGLike(Protocol):
    """The methods idist calls on a torch ProcessGroup or a backend (ProcessGroupGloo...)."""

    def allreduce(self, tensors: list[torch.Tensor], opts: AllreduceOptions, /) -> Work: ...
    def allgather(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: AllgatherOptions = ...,
        /,
    ) -> Work: ...
    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: AllgatherOptions = ..., /) -> Work: ...
    def broadcast(self, tensors: list[torch.Tensor], opts: BroadcastOptions, /) -> Work: ...
    def barrier(self, opts: BarrierOptions = ..., /) -> Work: ...


@functools.lru_cache(maxsize=64)  # a few (op, section timeout) pairs; checked mode uses one per call
def _options(op: str, timeout: datetime.timedelta | None = None) -> AllreduceOptions:
    opts = AllreduceOptions()
    opts.reduceOp = _TORCH_OPS[op]  # type: ignore[assignment]  # torch's stub types it as its enum class
    if timeout is not None:
        opts.timeout = timeout
    return opts


_OPTIONS = {op: _options(op) for op in _TORCH_OPS}


@functools.lru_cache(maxsize=16)
def _gather_options(timeout: datetime.timedelta | None = None) -> AllgatherOptions:
    opts = AllgatherOptions()
    if timeout is not None:
        opts.timeout = timeout
    return opts


_GATHER = _gather_options()


@attrs.frozen
class BrokenPG:
    """What a broken group's comms hold instead of their process group: every call raises why."""

    reason: str

    def _raise(self, *args: object) -> Work:
        raise GroupBrokenError(f"the group is broken ({self.reason}); finalize this context and create a new one")

    allreduce = allgather = _allgather_base = broadcast = barrier = _raise


@attrs.define(eq=False)
class NativeComm:
    """Byte and tensor collectives over one torch ProcessGroup."""

    pg: PGLike
    ranks: tuple[int, ...]
    group_rank: int
    #: failure reports, checked mode and section timeouts (its store is None when adopted without one)
    guard: Guard
    #: where tensors must live for this backend (cuda for nccl), None for anywhere
    stage: torch.device | None = None
    #: slot, number-sum mode, broadcast guesses, collective and agreement counters (see ``LockStep``)
    lockstep: LockStep = attrs.Factory(LockStep)
    scratch: dict[str, torch.Tensor] = attrs.Factory(dict)
    #: this group's namespace in the store (see _guard)
    key: str = "world"
    #: gather straight into one flat buffer (``_allgather_base``: one copy less); not on mpi
    flat: bool = True
    #: tensors the group's worker threads may still hold (see _inflight)
    inflight: InFlight = attrs.Factory(InFlight)

    def _wait(self, work: Callable[[], Work | tuple[Work, Work]], what: str, *tensors: torch.Tensor) -> None:
        self.lockstep.seq += 1
        counts = self.inflight.before(tensors)
        failed = True
        started: Work | tuple[Work, Work] | None = None
        try:
            started = work()
            if isinstance(started, tuple):
                started[0].wait()
                started[1].wait()
            else:
                started.wait()
            failed = False
        except RuntimeError as exc:
            del work  # these hold the group, whose connections the failure closes
            started = None
            raise self.guard.failure(self, exc, what) from exc
        finally:
            self.inflight.after(tensors, counts, failed)

    def _run(self, start: Callable[[list[torch.Tensor], Any], Work], t: torch.Tensor, opts: object, what: str) -> None:
        """``start([t], opts).wait()`` for the one-tensor calls (``_wait``, without its closures)."""
        self.lockstep.seq += 1
        inflight = self.inflight
        count = inflight.before_one(t)
        failed = True
        try:
            start([t], opts).wait()
            failed = False
        except RuntimeError as exc:
            del start  # a bound method of the group, whose connections the failure closes
            raise self.guard.failure(self, exc, what) from exc
        finally:
            inflight.held.append((t, count, failed))

    def _timeout(self) -> datetime.timedelta | None:
        sections = self.guard.sections
        return sections[-1] if sections else None

    def allgather_bytes(self, buf: torch.Tensor) -> torch.Tensor:
        n = len(self.ranks)
        if self.stage is not None:
            buf = buf.to(self.stage)
        out = torch.empty(n * buf.numel(), dtype=torch.uint8, device=buf.device)
        sections = self.guard.sections
        opts = _gather_options(sections[-1]) if sections else _GATHER
        if self.flat:
            self._wait(lambda: self.pg._allgather_base(out, buf, opts), "all_gather", out, buf)
        else:
            chunks = out.chunk(n)
            self._wait(lambda: self.pg.allgather([list(chunks)], [buf], opts), "all_gather", buf, *chunks)
        return out if self.stage is None else out.cpu()

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
        opts = self._broadcast_options(src)
        if self.stage is None and t.is_contiguous():
            self._run(self.pg.broadcast, t, opts, "broadcast")
        else:
            self._staged(t, lambda x: self._run(self.pg.broadcast, x, opts, "broadcast"))

    def broadcast_pair(self, head: torch.Tensor, data: torch.Tensor, src: int) -> None:
        """Both broadcasts start before either is waited for: the data does not wait for the header."""
        opts = self._broadcast_options(src)
        pg = self.pg
        self._wait(lambda: (pg.broadcast([head], opts), pg.broadcast([data], opts)), "broadcast", head, data)

    def allreduce(self, t: torch.Tensor, op: str) -> None:
        sections = self.guard.sections
        opts = _options(op, sections[-1]) if sections else _OPTIONS[op]
        if self.stage is None and t.is_contiguous():
            self._run(self.pg.allreduce, t, opts, "all_reduce")
        else:
            self._staged(t, lambda x: self._run(self.pg.allreduce, x, opts, "all_reduce"))

    def barrier(self) -> None:
        opts = BarrierOptions()
        timeout = self._timeout()
        if timeout is not None:
            opts.timeout = timeout
        self._wait(lambda: self.pg.barrier(opts), "barrier")

    def _staged(self, t: torch.Tensor, run: Callable[[torch.Tensor], None]) -> None:
        # The input is the result even when the backend needs another device or layout.
        stage = self.stage
        if stage is not None and t.device == stage and t.is_contiguous():
            run(t)
            return
        work = t.to(stage) if stage is not None else t
        work = work.contiguous()
        run(work)
        t.copy_(work)
