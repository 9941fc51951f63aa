"""Moving frames between ranks with a *slot* agreed by all of them.

gloo aborts a process when ranks pass different sizes to one all_gather, so
every rank must know the byte size before the data moves. Instead of a separate size
exchange on every call, each group remembers the slot size that the last exchange agreed
on (every rank derives it from the same gathered lengths, so it is the same everywhere).
A frame that fits its slot moves in one collective; otherwise the first round carries only
its length and a second round moves everything with a slot that fits.
"""

from __future__ import annotations

import ctypes
from typing import Protocol

import torch

from ._codec import decode
from ._errors import IdistError
from ._frame import LENGTH, Frame, frame_length

MIN_SLOT = 64
_string_at = ctypes.string_at
_memmove = ctypes.memmove


class Comm(Protocol):
    """What a backend gives the exchange: byte collectives over one group."""

    @property
    def ranks(self) -> tuple[int, ...]:
        """Global ranks of the group, in group order."""
        ...

    @property
    def group_rank(self) -> int: ...

    slot: int
    #: the last SUM of Python numbers had to be gathered (floats on 3+ ranks, see _number_sum)
    sum_by_gather: bool

    def allgather_bytes(self, buf: torch.Tensor) -> torch.Tensor:
        """Gather equal-sized CPU uint8 buffers; returns ``size * len(buf)`` bytes (CPU)."""
        ...

    def broadcast_bytes(self, buf: torch.Tensor, src: int) -> None:
        """Broadcast a CPU uint8 buffer in place from group rank ``src``."""
        ...


def _slot_for(length: int) -> int:
    return max(MIN_SLOT, 1 << max(0, length - 1).bit_length())


def _fill(frame: Frame, size: int) -> torch.Tensor:
    if frame.nbytes <= size:
        return frame.to_buffer(size)
    buf = torch.empty(size, dtype=torch.uint8)
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
    size = comm.slot
    out = comm.allgather_bytes(_fill(frame, size))
    n = len(comm.ranks)
    longest = max(_lengths(out, size, n))
    if longest > size:
        size = _slot_for(longest)
        out = comm.allgather_bytes(_fill(frame, size))
    comm.slot = _slot_for(longest)
    if n == 1:
        return [out]
    return [out[r * size : (r + 1) * size] for r in range(n)]


def broadcast_frame(comm: Comm, frame: Frame | None, src: int) -> torch.Tensor:
    """Broadcast ``frame`` (given on group rank ``src`` only); returns the frame's bytes."""
    mine = frame if comm.group_rank == src else None
    size = comm.slot
    buf = _fill(mine, size) if mine is not None else torch.empty(size, dtype=torch.uint8)
    comm.broadcast_bytes(buf, src)
    length = frame_length(buf)
    if length > size:
        size = _slot_for(length)
        buf = _fill(mine, size) if mine is not None else torch.empty(size, dtype=torch.uint8)
        comm.broadcast_bytes(buf, src)
    comm.slot = _slot_for(length)
    return buf


def decode_all(comm: Comm, bufs: list[torch.Tensor], what: str) -> list[object]:
    """Decode gathered frames; if any rank shipped an error, raise it here on every rank."""
    values = [decode(b) for b in bufs]
    for rank, value in zip(comm.ranks, values, strict=False):
        if isinstance(value, IdistError):
            raise type(value)(f"{what} failed on rank {rank}: {value}")
    return values
