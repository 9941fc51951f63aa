"""``HorovodComm``: byte and tensor collectives over one Horovod process set.

Every op carries an explicit name, the same on every member: Horovod matches ops by name,
and its default names count calls per process, which drift apart once some ranks run
subgroup ops that others do not. Names also repeat from call to call, so that Horovod's
response cache skips the coordinator's negotiation of a repeated op (a name that never
repeats never hits it, and evicts the user's own entries). Byte exchanges and broadcasts
are named by their byte count, which every member shares by construction (the agreed slot,
the agreed shape); all_reduce, whose shapes the ranks may wrongly disagree on (Horovod must
see those under one name to report it), by a per-set call counter modulo ``AR_NAMES``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import torch

from ..._errors import CollectiveInputError
from ..._exchange import LockStep
from ..._inplace import plain, resolved, write
from . import _lib
from ._lib import mapped_errors

#: all_reduce names cycle through this many per process set (divisible by 1-6, 10, 12, 15...)
AR_NAMES = 60

if TYPE_CHECKING:
    from horovod.torch import ProcessSet


@attrs.define(eq=False)
class HorovodComm:
    """Byte and tensor collectives over one Horovod process set."""

    process_set: ProcessSet
    ranks: tuple[int, ...]
    group_rank: int
    #: slot, broadcast guesses and the all_reduce counter (``seq``, modulo
    #: ``AR_NAMES``): the same on every member
    lockstep: LockStep = attrs.Factory(LockStep)
    scratch: dict[str, torch.Tensor] = attrs.Factory(dict)
    #: device types on which Horovod said it has no Adasum kernel (a gloo-only build): emulated
    no_native_adasum: set[str] = attrs.Factory(set)

    @property
    def confirms(self) -> bool:
        """No round confirms a pickle (``_exchange.confirmed``): Horovod has no checked mode."""
        return False

    def _name(self, kind: str, key: str) -> str:
        return f"idist.{kind}.{self.process_set.process_set_id}.{key}"

    def allgather_bytes(self, buf: torch.Tensor) -> torch.Tensor:
        hvd = _lib.hvd
        with mapped_errors("all_gather"):
            name = self._name("ag", str(buf.numel()))
            out = hvd.synchronize(hvd.allgather_async(buf, name=name, process_set=self.process_set))
        assert out is not None
        return out

    def broadcast_bytes(self, buf: torch.Tensor, src: int) -> None:
        self.broadcast(buf, src)

    def broadcast(self, t: torch.Tensor, src: int) -> None:
        """In place from group rank ``src``; any dtype (moved as raw bytes)."""
        self.broadcast_many([t], src)

    def broadcast_pair(self, head: torch.Tensor, data: torch.Tensor, src: int) -> None:
        """A header and its data in one negotiation: the data does not wait for the header."""
        self.broadcast_many([head, data], src)

    def broadcast_many(self, tensors: list[torch.Tensor], src: int) -> None:
        """Broadcast several tensors in place from group rank ``src``: all in flight, then wait."""
        hvd = _lib.hvd
        pending = []
        for index, t in enumerate(tensors):
            work = t if t.is_contiguous() and plain(t) else resolved(t).contiguous()
            raw = work.reshape(-1).view(torch.uint8)
            if raw.numel() == 0:
                continue
            name = self._name("bc", f"{index}.{raw.numel()}")
            pending.append(
                (t, work, hvd.broadcast_async_(raw, self.ranks[src], name=name, process_set=self.process_set))
            )
        failure: BaseException | None = None
        for t, work, handle in pending:
            try:
                with mapped_errors("broadcast"):
                    hvd.synchronize(handle)
            except BaseException as exc:  # wait for the others too: their names are reused next call
                failure = failure or exc
                continue
            if work is not t and src != self.group_rank:  # src's own tensor is only read
                write(t, work)
        if failure is not None:
            raise failure

    def allreduce(self, t: torch.Tensor, op: str) -> None:
        """In place with a native Horovod op; ``t`` must have a dtype Horovod reduces (``_fold``)."""
        hvd = _lib.hvd
        work = t if t.is_contiguous() and plain(t) else resolved(t).contiguous()
        step = self.lockstep
        step.seq = (step.seq + 1) % AR_NAMES
        name = self._name("ar", str(step.seq))
        with mapped_errors("all_reduce"):
            hvd.synchronize(hvd.allreduce_async_(work, name=name, op=_lib.op_code(op), process_set=self.process_set))
        if work is not t:
            write(t, work)

    def barrier(self) -> None:
        with mapped_errors("barrier"):
            _lib.hvd.barrier(process_set=self.process_set)


def register_process_set(ranks: tuple[int, ...]) -> ProcessSet:
    """The Horovod process set of ``ranks`` (collective: every rank of the world calls it)."""
    try:
        return _lib.hvd.add_process_set(list(ranks))
    except ValueError as exc:
        text = str(exc)
        if "duplicate" in text:
            existing = _existing_process_set(ranks)
            if existing is not None:
                return existing
        raise CollectiveInputError(
            f"cannot create the Horovod process set {list(ranks)}: {text.strip()}. Initialize Horovod with "
            "hvd.init(process_sets='dynamic') (idist.initialize('horovod') does), or register the set "
            "yourself and pass the hvd.ProcessSet as group="
        ) from exc


def _existing_process_set(ranks: tuple[int, ...]) -> ProcessSet | None:
    """The registered process set with exactly these ranks (one someone else added)."""
    from horovod.common import process_sets as ps_mod  # private API, loaded only on this rare path

    try:
        ids: dict[int, list[int]] = ps_mod._basics._get_process_set_ids_and_ranks()
    except (AttributeError, ValueError):
        return None
    for ps_id, members in ids.items():
        if tuple(members) == ranks:
            found: ProcessSet = ps_mod._temp_process_set_object(ps_id)
            found.ranks = list(members)
            return found
    return None
