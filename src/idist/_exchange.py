"""Moving frames between ranks with a *slot* agreed by all of them, and ``LockStep``, the
state of a group that every rank advances alike.

gloo aborts a process when ranks pass different sizes to one all_gather, so every rank
must know the byte size before the data moves. Each group remembers the slot size that its
last exchange agreed on (every rank derives it from the same gathered lengths). A frame
that fits its slot moves in one collective; otherwise the first round carries only its
length and a second round moves everything with a slot that fits.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Protocol, TypeVar

import attrs
import torch

from ._codec import decode, decode_error, encode, encode_error
from ._errors import UnsupportedValueError
from ._frame import LENGTH, Frame, Tag, frame_length, peek

MIN_SLOT = 64
T = TypeVar("T")
_string_at = ctypes.string_at
_memmove = ctypes.memmove

#: a src's shape and dtype, as the header of its last large tensor broadcast said (``_speculative``)
Guess = tuple[tuple[int, ...], torch.dtype]


@attrs.define
class LockStep:
    """The state of one group that must be equal on every rank of it after every call.

    The rule: a field changes only as a function of what every rank of the group saw in the
    same collective (gathered lengths, a sum, a broadcast header, an agreement in the store),
    never of this rank's own input or outcome. A call that raises must raise on every rank
    after the same changes, or break the group; an early return on one rank is a hang.
    ``tests/test_lockstep.py`` compares every rank's copy after each call of a mixed sequence.
    """

    #: the byte size the next exchange sends (see ``gather_slots``)
    slot: int = MIN_SLOT
    #: per group rank of src: its last large tensor's shape and dtype, and whether to trust it (``_speculative``)
    guesses: dict[int, tuple[Guess, bool]] = attrs.Factory(dict)
    #: the group's collectives so far, as its backend counts them (native: every backend call, keying
    #: the failure records in the store; Horovod: every all_reduce, naming it)
    seq: int = 0
    #: failures before communicating that every rank agreed on (native; keys the next agreement)
    agreed: int = 0


class Comm(Protocol):
    """What a backend gives the exchange: byte collectives over one group."""

    @property
    def ranks(self) -> tuple[int, ...]:
        """Global ranks of the group, in group order."""
        ...

    @property
    def group_rank(self) -> int: ...

    #: what every rank of the group advances alike (see ``LockStep``)
    lockstep: LockStep
    #: large send and receive buffers kept from call to call (see ``_buffer``)
    scratch: dict[str, torch.Tensor]

    @property
    def confirms(self) -> bool:
        """Whether a pickle that some ranks could not load costs one more round, so that every
        rank raises (``confirmed``): checked mode only, as the round doubles a small pickled call."""
        ...

    def allgather_bytes(self, buf: torch.Tensor) -> torch.Tensor:
        """Gather equal-sized CPU uint8 buffers; returns ``size * len(buf)`` bytes (CPU)."""
        ...

    def broadcast_bytes(self, buf: torch.Tensor, src: int) -> None:
        """Broadcast a CPU uint8 buffer in place from group rank ``src``."""
        ...


def _slot_for(length: int) -> int:
    """Room for a frame of ``length`` bytes: a multiple of a sixteenth of the next power of two
    (so a frame that grows a little next time still fits, and at most 1/8 is padding)."""
    if length <= MIN_SLOT:
        return MIN_SLOT
    step = max(MIN_SLOT, (1 << (length - 1).bit_length()) >> 4)
    return -(-length // step) * step


#: buffers from this size up to SCRATCH_MAX are kept on the comm and reused (see ``_buffer``)
SCRATCH_MIN = 1 << 16
SCRATCH_MAX = 1 << 24
#: the largest slot a group remembers: after a larger frame the next exchange starts from
#: MIN_SLOT (its lengths first), so one outsized call costs the calls after it nothing
SLOT_MAX = 1 << 20


def _next_slot(length: int) -> int:
    """The slot every rank remembers after an exchange whose longest frame had ``length`` bytes."""
    slot = _slot_for(length)
    return slot if slot <= SLOT_MAX else MIN_SLOT


def _buffer(comm: Comm, use: str, size: int) -> torch.Tensor:
    """A ``size``-byte buffer for ``use`` ("send" or "receive"): a large one is the comm's own,
    reused by the next call of the same size (fresh memory of that size costs page faults on
    every call); an outsized one (past ``SCRATCH_MAX``) is the call's alone and leaves with it.
    Only for bytes that are copied out before the call returns."""
    if size < SCRATCH_MIN or size > SCRATCH_MAX:
        return torch.empty(size, dtype=torch.uint8)
    buf = comm.scratch.get(use)
    if buf is None or buf.numel() != size:
        buf = comm.scratch[use] = torch.empty(size, dtype=torch.uint8)
    return buf


def _fill(frame: Frame, size: int, comm: Comm | None = None) -> torch.Tensor:
    """``frame`` at the start of a ``size``-byte buffer (the comm's own, when given and large),
    or only its length when it does not fit."""
    if comm is None or size < SCRATCH_MIN:
        if frame.nbytes <= size:
            return frame.to_buffer(size)
        buf = torch.empty(size, dtype=torch.uint8)
    else:
        buf = _buffer(comm, "send", size)
        if frame.nbytes <= size:
            frame.write(buf)
            return buf
    _memmove(buf.data_ptr(), LENGTH.pack(frame.nbytes), 8)
    return buf


def _lengths(out: torch.Tensor, size: int, n: int) -> list[int]:
    """The frame length at the start of each of the ``n`` slots of ``out``."""
    if not (out.is_cpu and out.is_contiguous()):
        out = out.cpu().contiguous()
    ptr = out.data_ptr()
    unpack = LENGTH.unpack
    return [unpack(_string_at(ptr + r * size, 8))[0] for r in range(n)]


def gather_frames(comm: Comm, frame: Frame) -> list[torch.Tensor]:
    """All-gather one frame per rank; returns each rank's frame bytes in group order."""
    out, size = gather_slots(comm, frame)
    n = len(comm.ranks)
    if n == 1:
        return [out]
    return [out[r * size : (r + 1) * size] for r in range(n)]


def gather_slots(comm: Comm, frame: Frame) -> tuple[torch.Tensor, int]:
    """All-gather one frame per rank: the bytes (CPU) and the slot size (rank r's frame at r * size)."""
    step = comm.lockstep
    size = step.slot
    out = comm.allgather_bytes(_fill(frame, size, comm))
    longest = max(_lengths(out, size, len(comm.ranks)))
    if longest > size:
        size = _slot_for(longest)
        out = comm.allgather_bytes(_fill(frame, size, comm))
    step.slot = _next_slot(longest)
    return out, size


def all_start_with(out: torch.Tensor, size: int, n: int, head: bytes) -> bool:
    """Whether every one of the ``n`` slots of ``out`` (CPU, contiguous) starts with ``head``."""
    ptr = out.data_ptr()
    h = len(head)
    return all(_string_at(ptr + r * size, h) == head for r in range(n))


def first_slot(comm: Comm, frame: Frame | None) -> torch.Tensor:
    """What a broadcast's first round sends: ``frame`` in the agreed slot (src), or room for it."""
    slot = comm.lockstep.slot
    return _fill(frame, slot, comm) if frame is not None else _buffer(comm, "receive", slot)


def broadcast_frame(comm: Comm, frame: Frame | None, src: int) -> torch.Tensor:
    """Broadcast ``frame`` (given on group rank ``src`` only); returns the frame's bytes."""
    buf = first_slot(comm, frame)
    comm.broadcast_bytes(buf, src)
    return finish_broadcast(comm, buf, frame, src)


def finish_broadcast(comm: Comm, buf: torch.Tensor, frame: Frame | None, src: int) -> torch.Tensor:
    """The whole frame once its first slot ``buf`` arrived: a second round if it did not fit."""
    length = frame_length(buf)
    if length > buf.numel():
        size = _slot_for(length)
        buf = _fill(frame, size, comm) if frame is not None else _buffer(comm, "receive", size)
        comm.broadcast_bytes(buf, src)
    comm.lockstep.slot = _next_slot(length)
    return buf


def decode_all(comm: Comm, bufs: list[torch.Tensor], what: str) -> list[object]:
    """Decode gathered frames, the same on every rank: if any rank shipped an error, raise the first
    (in rank order) here; a value that does not unpickle raises ``UnsupportedValueError`` naming its rank."""
    pairs = list(zip(comm.ranks, bufs, strict=False))
    for rank, buf in pairs:  # the first error in rank order, before any value is decoded
        if peek(buf)[0] is Tag.ERROR:
            decode_from(buf, rank, what)
    if comm.confirms and any(peek(buf)[0] is Tag.PICKLE for _, buf in pairs):  # every rank sees the same tags
        return confirmed(comm, lambda: [decode_from(buf, rank, what) for rank, buf in pairs])
    return [decode_from(buf, rank, what) for rank, buf in pairs]


def confirmed(comm: Comm, decode: Callable[[], T]) -> T:
    """``decode()`` on every rank, then one more round in which each says whether it could: a
    pickle may load on some ranks only (a class that one rank cannot import), and no rank may
    return while another raises. A byte a rank; the failures' frames only when one failed."""
    error: UnsupportedValueError | None = None
    try:
        value = decode()
    except UnsupportedValueError as exc:
        error = exc
    failed = comm.allgather_bytes(torch.tensor([error is not None], dtype=torch.uint8))
    if error is None and not bool(failed.any()):
        return value
    said = gather_frames(comm, encode_error(error) if error is not None else encode(None))
    for rank, buf in zip(comm.ranks, said, strict=False):  # the first in rank order, on every rank
        if peek(buf)[0] is Tag.ERROR:
            shipped = decode_error(buf)
            raise type(shipped)(f"{shipped}; rank {rank} could not load it")
    raise AssertionError("a rank said it failed and shipped no error")


def decode_from(buf: torch.Tensor, rank: int, what: str) -> object:
    """The value global rank ``rank`` sent in ``buf``: an error it shipped is raised naming it, and
    a value that does not unpickle raises ``UnsupportedValueError`` naming it (the same on every rank)."""
    if peek(buf)[0] is Tag.ERROR:
        shipped = decode_error(buf)
        raise type(shipped)(f"{what} failed on rank {rank}: {shipped}")
    try:
        return decode(buf)
    except UnsupportedValueError as exc:
        raise UnsupportedValueError(f"{what} failed: the value of rank {rank}: {exc}") from exc.__cause__
