"""The simulated world's transport: every collective of every rank meets in one ``Hub``.

A rank's ``SimulatedGroup`` is a torch ``ProcessGroup`` (so DDP runs over it) whose calls
meet their peers' calls in memory: the last rank to arrive moves the data for all of them,
under the hub's lock, and wakes the others. No socket, file or thread per rank or pair.
It behaves as a gloo group does: gloo's dtypes and ops only, each call waits at most its
timeout, a call that fails leaves the group unusable for every member, and a member whose
group is released (or whose function returned, ``finished``) fails the calls waiting for it.
The world's runner ends a run early with ``abort``: every call waiting, or made later, raises.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d
from torch._C._distributed_c10d import Work
from torch.futures import Future

from . import _moves

#: a Work that is done, with ``fut``'s result (what torch's own threaded test group returns)
_work_from: Callable[[Future[object]], Work] = vars(c10d)["_create_work_from_future"]
_group_init: Callable[..., None] = dist.ProcessGroup.__init__
if TYPE_CHECKING:
    _ProcessGroup = object  # torch's stubs overload each method; a subclass keeps only the form it serves
else:
    _ProcessGroup = dist.ProcessGroup


class TransportError(RuntimeError):
    """A simulated collective failed (a ``RuntimeError``, as the backend's own errors are).

    ``consequence`` is True when another rank's failure (or the runner) caused it."""

    consequence = False


class WorldAborted(TransportError):
    """The runner ended the run: a rank failed, or the run timed out."""

    consequence = True


class PeerGone(TransportError):
    """A member this call needs released its group, timed out, or returned from its function."""

    consequence = True


def _done(result: object) -> Work:
    fut: Future[object] = Future()
    fut.set_result(result)  # DDP's reducer reads the tensors back from the future
    return _work_from(fut)


class _Meeting:
    """One collective of one group: what each member brought, until the last one arrives."""

    __slots__ = ("arrived", "done", "key", "over", "payloads")

    def __init__(self, key: tuple[object, ...], size: int) -> None:
        self.key = key
        self.payloads: list[Any] = [None] * size
        self.arrived = 0
        self.done = False
        #: set when the collective completed or failed: its waiters wake (one event each, not one
        #: condition for the world: a few hundred ranks would all wake for every collective)
        self.over = threading.Event()


class _GroupState:
    """A group's members and collectives in flight; ``failed`` says why it is no longer usable."""

    def __init__(self, ranks: tuple[int, ...]) -> None:
        self.ranks = ranks
        self.index = {r: i for i, r in enumerate(ranks)}
        self.meetings: dict[int, _Meeting] = {}
        self.seqs = [0] * len(ranks)
        self.failed: TransportError | None = None


class Hub:
    """Where the collectives of one simulated world meet (see the module docstring)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        # re-entrant: a group released by the garbage collector leaves from inside a call
        self.lock = threading.RLock()
        self.groups: dict[tuple[int, ...], _GroupState] = {}
        self.aborted: WorldAborted | None = None
        #: global ranks whose function returned in this run: a call waiting for them fails
        self.finished: dict[int, str] = {}

    def group(self, ranks: tuple[int, ...], group_rank: int, timeout: float) -> SimulatedGroup:
        """Group rank ``group_rank``'s handle on the group of global ``ranks``."""
        with self.lock:
            state = self.groups.setdefault(ranks, _GroupState(ranks))
        return SimulatedGroup(self, state, group_rank, timeout)

    # ------------------------------------------------------------- the runner's side
    def abort(self, reason: str) -> set[int]:
        """End the run: every call waiting, or made from now on, raises ``WorldAborted(reason)``.
        The global ranks that were waiting in a collective (they wake now)."""
        woken: set[int] = set()
        with self.lock:
            if self.aborted is None:
                self.aborted = WorldAborted(reason)
            for state in self.groups.values():
                for meeting in state.meetings.values():
                    woken.update(r for r, p in zip(state.ranks, meeting.payloads, strict=True) if p is not None)
                    meeting.over.set()
        return woken

    def begin_run(self) -> None:
        with self.lock:
            self.finished.clear()

    def finish(self, rank: int, why: str) -> None:
        """Global ``rank`` will make no more calls in this run: the calls that wait for it fail."""
        with self.lock:
            self.finished[rank] = why
            for state in self.groups.values():
                i = state.index.get(rank)
                if i is not None and any(m.payloads[i] is None for m in state.meetings.values()):
                    self._fail(state, _gone(rank, why))

    @property
    def spoiled(self) -> bool:
        """Whether a call failed on some group (or the run was aborted): the world needs rebuilding."""
        with self.lock:
            return self.aborted is not None or any(s.failed is not None for s in self.groups.values())

    # ------------------------------------------------------------- the groups' side
    def _fail(self, state: _GroupState, error: TransportError) -> None:
        if state.failed is None:
            state.failed = error
        for meeting in state.meetings.values():
            meeting.over.set()

    def leave(self, state: _GroupState, group_rank: int) -> None:
        with self.lock:
            rank = state.ranks[group_rank]
            self._fail(state, PeerGone(f"rank {rank} released its process group (its connections closed)"))

    def _raise_if_failed(self, state: _GroupState) -> None:
        error = self.aborted or state.failed
        if error is not None:
            raise type(error)(str(error))  # a new one per rank: each gets its own traceback

    def meet(
        self,
        state: _GroupState,
        group_rank: int,
        key: tuple[object, ...],
        payload: object,
        move: Callable[[list[Any]], None],
        timeout: float,
    ) -> None:
        """Bring ``payload`` to this group's next collective; the last member runs ``move``."""
        with self.lock:
            self._raise_if_failed(state)
            seq = state.seqs[group_rank] = state.seqs[group_rank] + 1
            meeting = state.meetings.get(seq)
            if meeting is None:
                meeting = state.meetings[seq] = _Meeting(key, len(state.ranks))
            elif meeting.key != key:
                self._fail(state, TransportError(_mismatch(state, meeting.key, key, group_rank)))
                self._raise_if_failed(state)
            meeting.payloads[group_rank] = payload
            meeting.arrived += 1
            if meeting.arrived == len(state.ranks):
                del state.meetings[seq]
                try:
                    move(meeting.payloads)
                except Exception as exc:
                    self._fail(state, TransportError(f"{key[0]}: {exc}"))
                    self._raise_if_failed(state)
                meeting.done = True
                meeting.over.set()
                return
            if self.finished:
                gone = [r for i, r in enumerate(state.ranks) if r in self.finished and meeting.payloads[i] is None]
                if gone:
                    self._fail(state, _gone(gone[0], self.finished[gone[0]]))
        if not meeting.over.wait(None if math.isinf(timeout) else timeout):
            with self.lock:
                if not meeting.over.is_set():
                    missing = [state.ranks[i] for i, p in enumerate(meeting.payloads) if p is None]
                    me = state.ranks[group_rank]
                    self._fail(state, PeerGone(f"rank {me} timed out in {key[0]} waiting for ranks {missing}"))
                    raise TransportError(f"{key[0]} timed out after {timeout:g}s: ranks {missing} did not arrive")
        if not meeting.done:
            with self.lock:
                self._raise_if_failed(state)


def _gone(rank: int, why: str) -> PeerGone:
    return PeerGone(f"rank {rank} {why}, while its peers waited for it in a collective")


def _mismatch(state: _GroupState, theirs: tuple[object, ...], mine: tuple[object, ...], group_rank: int) -> str:
    return (
        f"ranks called different collectives on group {list(state.ranks)}: rank {state.ranks[group_rank]} "
        f"{mine[0]}{list(mine[1:])}, an earlier rank {theirs[0]}{list(theirs[1:])}"
    )


class SimulatedGroup(_ProcessGroup):
    """One rank's handle on a group of a ``Hub`` (see the module docstring)."""

    def __init__(self, hub: Hub, state: _GroupState, group_rank: int, timeout: float) -> None:
        _group_init(self, group_rank, len(state.ranks))
        self._hub = hub
        self._state = state
        self._grank = group_rank
        self._timeout = timeout

    def __del__(self) -> None:
        # what closing gloo's connections does: the peers waiting on this rank fail now
        try:
            self._hub.leave(self._state, self._grank)
        except Exception:  # noqa: S110 - at interpreter exit the hub may be half torn down
            pass

    def _seconds(self, opts: Any) -> float:
        seconds = float(opts.timeout.total_seconds())
        return self._timeout if seconds < 0 else seconds

    def _meet(self, key: tuple[object, ...], payload: object, move: Callable[[list[Any]], None], opts: Any) -> None:
        self._hub.meet(self._state, self._grank, key, payload, move, self._seconds(opts))

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        opts = opts if opts is not None else c10d.AllreduceOptions()
        op = opts.reduceOp.op
        if op not in _moves.OPS:
            raise TransportError(f"allreduce: gloo has no reduce op {op}")
        for t in tensors:
            _moves.check(t, "allreduce", op)
        self._meet(("allreduce", op, len(tensors)), tensors, _moves.allreduce(op), opts)
        return _done(tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        opts = opts if opts is not None else c10d.BroadcastOptions()
        for t in tensors:
            _moves.check(t, "broadcast")
        self._meet(("broadcast", opts.rootRank, len(tensors)), tensors, _moves.broadcast(opts.rootRank), opts)
        return _done(tensors)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Work:
        opts = opts if opts is not None else c10d.AllgatherOptions()
        if len(inputs) != 1 or len(outputs) != 1:
            raise TransportError("allgather: one input tensor per rank")
        _moves.check(inputs[0], "allgather")
        self._meet(("allgather",), (outputs[0], inputs[0]), _moves.allgather, opts)
        return _done(outputs)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        opts = opts if opts is not None else c10d.AllgatherOptions()
        _moves.check(input, "allgather")
        self._meet(("allgather",), (output, input), _moves.allgather, opts)
        return _done([output])

    def alltoall_base(
        self, output: torch.Tensor, input: torch.Tensor, output_splits: list[int], input_splits: list[int],
        opts: Any = None,
    ) -> Work:  # fmt: skip
        opts = opts if opts is not None else c10d.AllToAllOptions()
        if output_splits or input_splits:
            raise TransportError("alltoall: equal parts only (split sizes are not simulated)")
        _moves.check(input, "alltoall")
        self._meet(("alltoall",), (output, input), _moves.alltoall, opts)
        return _done([output])

    def barrier(self, opts: Any = None) -> Work:
        opts = opts if opts is not None else c10d.BarrierOptions()
        self._meet(("barrier",), (), _moves.barrier, opts)
        return _done([])

    def size(self) -> int:
        return len(self._state.ranks)

    def getBackendName(self) -> str:
        return "idist-simulated"
