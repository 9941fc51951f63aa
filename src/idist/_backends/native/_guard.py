"""Never hang, never lie: checked collectives, failures judged into verdicts, section timeouts.

Checked mode compares every rank's call in one small collective before data moves (a rank
whose own input is bad ships its error there, so every rank raises it and the group stays
usable). Unchecked, a rank that fails before communicating publishes its error in the
store and waits briefly for its peers to fail the same way; if they do not, the verdict is
a broken group. A backend failure, or a peer the liveness watcher lost, is judged into a
``Verdict`` naming the ranks that did not arrive; the caller acts on it. See docs/failures.md.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import attrs
import torch
from torch._C._distributed_c10d import Store

from ... import _codec, _exchange
from ..._errors import CollectiveMismatchError, IdistError
from ..._marks import Marks
from . import _agreement
from ._agreement import BROKEN_KEY
from ._liveness import Heartbeat, Lost
from ._tally import Tally
from ._verdict import Fault, Verdict, bounded, first_line, read

if TYPE_CHECKING:
    from ._comm import NativeComm

#: how long a failing rank waits for its peers' stall reports
STALL_GRACE = 3.0
#: how long a checked collective waits for every rank before naming the absent ones
CHECKED_WAIT = 10.0
#: how long a rank that failed on its own waits for its peers to fail the same way, on a backend
#: whose waits cannot tell it that they are in the collective instead (nccl, mpi: see Guard.agree)
BLIND_WINDOW = 0.3
_SEP = "\x1f"
_COMPARED = 5  # call, op, data, src, group (not the call site)
#: hashes below 2**52 sum exactly in float64 on two ranks
_HASH_MASK = (1 << 52) - 1
#: what a rank with an error sends instead of its call's hash (more than two ranks)
_ERROR_MARK = b"\xff" * 8


def checked_from_env() -> bool:
    return os.environ.get("IDIST_CHECKED", "").lower() in ("1", "true", "yes", "on")


def call_site() -> str:
    """``file:line`` of the first frame outside idist (the user's call)."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("idist."):
        frame = frame.f_back
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def fingerprint(call: str, op: str = "", data: str = "", src: str = "", group: Sequence[int] = ()) -> str:
    """What checked mode compares between ranks (the call site is added only to a report)."""
    return _SEP.join((call, op, data, src, ",".join(map(str, group))))


def _same_on_two(comm: NativeComm, fp: str, error: IdistError | None) -> bool:
    """Whether both ranks of ``comm`` made this call with no error (one-element SUM of hashes)."""
    mine = math.nan
    if error is None:
        mine = float(int.from_bytes(hashlib.blake2b(fp.encode(), digest_size=7).digest(), "little") & _HASH_MASK)
    total = comm.guard.check_sum.fill_(mine)  # the last check's work is done: reuse its tensor
    comm.allreduce(total, "SUM")
    return bool(total.item() == 2 * mine)


def _same_on_all(comm: NativeComm, fp: str, error: IdistError | None) -> bool:
    """Whether every rank of ``comm`` made this call with no error (all_gather of 8-byte hashes;
    a SUM cannot say it on more than two ranks: every rank must reach the same answer)."""
    mine = _ERROR_MARK if error is not None else hashlib.blake2b(fp.encode(), digest_size=8).digest()
    out = comm.allgather_bytes(torch.frombuffer(bytearray(mine), dtype=torch.uint8))
    digests = bytes(out.tolist())
    return digests == mine * len(comm.ranks) and mine != _ERROR_MARK


def describe(call: str, x: object) -> str:
    """What checked mode compares about a value: what the collective cannot check by itself.

    A tensor all_reduce moves raw memory, so its dtype and shape must match; Python values
    and every all_gather move self-describing frames, which already raise on a mismatch.
    """
    if call != "all_reduce":
        return ""
    return f"tensor {x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else "value"


@attrs.define(eq=False)
class Guard:
    """One context's watch over its collectives (shared by its comms)."""

    store: Store | None
    default_timeout: datetime.timedelta
    checked: bool = False
    sections: list[datetime.timedelta] = attrs.Factory(list)
    #: why the group is broken (every call then raises at once); None while it is usable
    broken: str | None = None
    #: the ranks on the node that serves the store, when known from the start (named when it
    #: stops answering; else the heartbeat's finding)
    store_host_ranks: tuple[int, ...] = ()
    #: ranks per node, to name the nodes of missing ranks (0 for a one-node job: no node named)
    nproc_per_node: int = 0
    #: the heartbeats of every rank (None: liveness off, or no store to beat on)
    liveness: Heartbeat | None = None
    #: this rank's stall mark, when its launcher reads it (``idist run``; see ``_marks``)
    marks: Marks | None = None
    #: the one-element tensor two ranks sum their call hashes in (see ``check``)
    check_sum: torch.Tensor = attrs.Factory(lambda: torch.zeros((), dtype=torch.float64))
    #: the failure this rank last told it waits in (see ``look``)
    _told: str = ""
    #: how long a checked collective waits for every rank (a simulated world: its run's timeout)
    checked_wait: datetime.timedelta = attrs.Factory(lambda: datetime.timedelta(seconds=CHECKED_WAIT))
    #: how long a failing rank waits for its peers' stall reports (in one process: moments)
    stall_grace: float = STALL_GRACE
    #: the context's namespace in the store (``_keys``): its subgroups' keys live there too
    namespace: str = "idist"
    #: the keys this guard wrote, relative to the namespace (deleted when the context closes)
    written: list[str] = attrs.Factory(lambda: [f"guard/{BROKEN_KEY}"])

    @property
    def timeout(self) -> datetime.timedelta:
        return self.sections[-1] if self.sections else self.default_timeout

    @contextmanager
    def section(self, seconds: float) -> Iterator[None]:
        if not seconds > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {seconds!r}")
        self.sections.append(datetime.timedelta(seconds=seconds))
        try:
            yield
        finally:
            self.sections.pop()

    # ------------------------------------------------------------ checked mode
    def check(self, comm: NativeComm, fp: str, error: IdistError | None) -> None:
        """Compare this call with the peers' (one small collective); raise on every rank alike.

        Two ranks compare a 52-bit hash of their calls in a one-element SUM (equal exactly when
        the sum is twice this rank's hash, the same answer on both; a rank with an error sends
        NaN); more ranks gather 8-byte hashes. Any difference gathers the calls for the report.
        """
        wait = self.sections[-1] if self.sections else self.checked_wait
        self.sections.append(wait)  # an absent rank is named after this wait, not the group's timeout
        call = fp.split(_SEP, 1)[0]
        comm.calling = f"{call} (checked mode's comparison)"  # what a failure names: the user's call
        try:
            if (_same_on_two if len(comm.ranks) == 2 else _same_on_all)(comm, fp, error):
                return
            fp = f"{fp}{_SEP}{call_site()}"
            frame = _codec.encode_error(error) if error is not None else _codec.encode(fp)
            bufs = _exchange.gather_frames(comm, frame)
        finally:
            self.sections.pop()
            comm.calling = None
        prints = [str(v).split(_SEP) for v in _exchange.decode_all(comm, bufs, call)]
        if any(p[:_COMPARED] != prints[0][:_COMPARED] for p in prints):
            raise CollectiveMismatchError(f"{call} differs between ranks:\n" + _table(comm.ranks, prints))

    # ------------------------------------------------ failures of one rank alone
    def agree(self, comm: NativeComm, call: str, exc: IdistError, others: Sequence[NativeComm] = ()) -> Verdict | None:
        """Publish that this rank failed before communicating, and wait until every rank of the
        group failed at the same call (None: nobody waits, the group stays usable) or one is found
        in the collective instead (its wait looks, ``look``), lost, or absent for the timeout in
        force (the verdict that this rank broke the group). ``others``: comms this rank may have
        meant (a bad group's), where a waiting peer also finds the failure.

        A group whose waits cannot look (nccl, mpi) waits ``BLIND_WINDOW`` for the others."""
        store = self.store
        if store is not None:
            comms = [comm, *others]
            self.written.extend(f"guard/{_agreement.fail_key(c)}" for c in comms)  # deleted at close
            limit = self.timeout.total_seconds() if comm.slice is not None else BLIND_WINDOW
            if _agreement.wait_for_peers(store, comms, limit, lambda: self.lost(comm.ranks)):
                for c in comms:
                    c.lockstep.agreed += 1
                return None
        me = comm.ranks[comm.group_rank]
        why = f"rank {me}, which raised {type(exc).__name__}: {exc}"
        return Verdict(call, comm.ranks, Fault.BROKEN, why=why)

    def look(self, comm: NativeComm) -> None:
        """Between two slices of a wait in ``comm``: if a peer published that it failed before
        communicating at this very call, add that this rank is in it (the peer then breaks the
        group, which ends this wait). One bounded store request; once per call."""
        store = self.store
        if store is None:
            return
        key = _agreement.fail_key(comm, comm.lockstep.seq - 1)  # the collective this wait belongs to
        if key != self._told and bounded(lambda: store.check([key]), 1.0):
            self._told = key
            bounded(lambda: store.add(key, len(comm.ranks) + 1), 1.0)

    def publish_broken(self, reason: str) -> None:
        """Mark the group broken here and tell the peers why (the first reason stays)."""
        self.broken = self.broken or reason
        store = self.store
        if store is not None:
            bounded(lambda: store.compare_set(BROKEN_KEY, "", reason), 1.0)

    # ----------------------------------------------------------- backend failures
    def lost(self, ranks: Sequence[int]) -> Lost | None:
        """The ranks of ``ranks`` the liveness watcher lost, or None (asked while a collective waits)."""
        return self.liveness.lost(ranks) if self.liveness is not None else None

    def judge(
        self, comm: NativeComm, call: str, exc: BaseException | None, lost: Lost | None, elapsed: float
    ) -> Verdict:
        """The first verdict on a failed collective: broken by a peer (the store says so), lost
        (the watcher's finding, or the backend's error), or timed out (it ran the whole timeout).
        ``report`` then completes a backend failure with the ranks that did not arrive."""
        base = Verdict(call, comm.ranks, Fault.LOST, nproc_per_node=self.nproc_per_node)
        if lost is not None:
            return attrs.evolve(base, missing=lost.ranks, why=lost.why)
        said = first_line(exc) if exc is not None else ""
        store = self.store
        by = bounded(lambda: read(store, BROKEN_KEY), 1.0) if store is not None else None
        if by:
            return attrs.evolve(base, fault=Fault.BROKEN, why=by, backend=said)
        timed_out = elapsed >= 0.95 * self.timeout.total_seconds()
        return attrs.evolve(base, fault=Fault.TIMEOUT if timed_out else Fault.LOST, backend=said)

    def count_in(self, comm: NativeComm) -> dict[int, Tally] | None:
        """Tell the peers that this rank reached its failed collective (``Tally``: O(1) requests),
        before it releases the group: a peer that waits for it hears it sooner. A rank counts in at
        its collective and as one behind and ahead (a peer there failed with the same fault, its
        part still in flight, or already done). The tallies for ``report``; None: the store did not
        answer. Bounded: the store may be gone."""
        store = self.store
        if store is None:
            return None
        seq, size = comm.lockstep.seq, len(comm.ranks)
        roll, near = f"stall/{comm.key}/who", tuple(str(s) for s in (seq - 1, seq, seq + 1))
        tallies = {
            s: Tally(store, f"stall/{comm.key}/{s}", size, roll, str(seq), near) for s in (seq - 1, seq, seq + 1)
        }
        self.written.extend(f"guard/{key}" for tally in tallies.values() for key in tally.keys)

        def tell() -> bool:
            tallies[seq].note(comm.group_rank)
            for tally in tallies.values():
                tally.arrive(comm.group_rank, listed=False)
            return True

        return tallies if bounded(tell, 2.0) else None

    def report(self, comm: NativeComm, verdict: Verdict, tallies: dict[int, Tally] | None) -> Verdict:
        """``verdict`` with the ranks that did not reach this collective: this rank counted itself
        in (``tallies``, from ``count_in``) and waits briefly for the count to complete; if it does
        not, one rank reads who came and posts who did not. A node-mate whose stall mark shows it in
        this call came, however late (a loaded machine can take seconds to wake it). Each step
        bounded: the store may be gone."""
        if self.store is None:
            return verdict
        grace = min(self.stall_grace, self.timeout.total_seconds())
        seq, marks = comm.lockstep.seq, self.marks

        def absent(tally: Tally) -> list[int]:
            if tally.wait(grace):
                return []
            here = marks.in_call((seq - 1, seq, seq + 1), comm.key, comm.ranks) if marks is not None else set()
            missing = tally.missing(2.0, lambda member: comm.ranks[member] in here)
            return [m for m in missing if m != comm.group_rank]  # a post made before it counted in

        missing = bounded(lambda: absent(tallies[seq]), grace + 3.0) if tallies is not None else None
        if missing is not None:
            return attrs.evolve(verdict, missing=tuple(comm.ranks[r] for r in missing))
        me = comm.ranks[comm.group_rank]
        served = (self.liveness.store_ranks if self.liveness is not None else ()) or self.store_host_ranks
        gone = tuple(r for r in comm.ranks if r in served and r != me)
        at = f" at {self.liveness.where}" if self.liveness is not None and self.liveness.where else ""
        why = f"the store{at} did not answer: its node is lost or unreachable"
        return attrs.evolve(verdict, missing=gone, why=why)


def _table(ranks: Sequence[int], prints: list[list[str]]) -> str:
    cols = ("call", "op", "data", "src", "group", "site")
    rows = [("rank", *cols)] + [(str(r), *(p + [""] * 6)[:6]) for r, p in zip(ranks, prints, strict=True)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols) + 1)]
    return "\n".join("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)
