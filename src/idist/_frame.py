"""Frames: the byte layout every value moves in, and reading a frame's header.

A frame is a uint8 tensor: ``[0:8)`` its total length (int64 LE), ``[8]`` a tag (``Tag``),
``[9]`` a dtype or error code, ``[10]`` ndim, ``[11:16)`` zero, then the shape as int64s
padded to a multiple of 16 bytes, then the payload (``_codec`` says what payloads hold).
"""

from __future__ import annotations

import ctypes
import enum
import struct

import torch

HEADER = 16
ALIGN = 16
LENGTH = struct.Struct("<q")
_META = struct.Struct("<qBBB5x")


class Tag(enum.IntEnum):
    ERROR = 0
    NONE = 1
    BOOL = 2
    INT = 3
    FLOAT = 4
    STR = 5
    BYTES = 6
    PATH = 7
    TENSOR = 8
    PICKLE = 9
    #: what a rank is about to reduce: the op (payload), dtype (code) and shape, no data
    REDUCE = 10


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def tensor_bytes(t: torch.Tensor) -> torch.Tensor:
    """The raw memory of ``t`` as a flat uint8 tensor (a view when ``t`` is contiguous)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def as_bytes(buf: torch.Tensor) -> bytes:
    """Copy a contiguous CPU uint8 tensor into ``bytes`` without numpy."""
    if buf.numel() == 0:
        return b""
    return ctypes.string_at(buf.data_ptr(), buf.numel())


string_at = ctypes.string_at
_memmove = ctypes.memmove
#: payloads up to this size are copied with one memmove; larger ones with torch (threads)
_MEMMOVE_MAX = 1 << 20


def host(buf: torch.Tensor) -> torch.Tensor:
    """``buf`` itself when its bytes can be read through ``data_ptr`` (CPU, contiguous)."""
    return buf if buf.is_cpu and buf.is_contiguous() else buf.cpu().contiguous()


class Frame:
    """One encoded value, not yet placed in a buffer.

    ``payload`` is bytes or a CPU tensor whose memory is the payload (any dtype and
    layout; ``nbytes`` counts its bytes).
    """

    __slots__ = ("head", "nbytes", "payload")

    def __init__(self, head: bytes, payload: torch.Tensor | bytes) -> None:
        self.head = head
        self.payload = payload
        n = payload.numel() * payload.element_size() if isinstance(payload, torch.Tensor) else len(payload)
        self.nbytes = len(head) + n

    def write(self, buf: torch.Tensor) -> None:
        """Write the frame at the start of ``buf`` (a CPU uint8 tensor at least ``nbytes`` long)."""
        if not (buf.is_cpu and buf.is_contiguous()):
            # rare: go through a host copy
            host = self.to_tensor()
            buf[: self.nbytes].copy_(host)
            return
        head = self.head
        h = len(head)
        ptr = buf.data_ptr()
        _memmove(ptr, head, h)
        p = self.payload
        n = self.nbytes - h
        if not n:
            return
        if not isinstance(p, torch.Tensor):
            _memmove(ptr + h, p, n)
        elif n <= _MEMMOVE_MAX and p.is_contiguous():
            _memmove(ptr + h, p.data_ptr(), n)
        else:
            buf[h : self.nbytes].copy_(tensor_bytes(p))

    def to_tensor(self) -> torch.Tensor:
        buf = torch.empty(self.nbytes, dtype=torch.uint8)
        self.write(buf)
        return buf

    def to_buffer(self, size: int) -> torch.Tensor:
        """A new CPU uint8 tensor of ``size >= nbytes`` bytes starting with the frame.

        Small buffers live in a ``bytearray`` (zeroed, written with plain slice
        assignment); large ones are ``torch.empty`` and written by ``write``.
        """
        if size > _MEMMOVE_MAX:
            buf = torch.empty(size, dtype=torch.uint8)
            self.write(buf)
            return buf
        raw = bytearray(size)
        head = self.head
        h = len(head)
        raw[:h] = head
        p = self.payload
        n = self.nbytes - h
        if not isinstance(p, torch.Tensor):
            raw[h : h + n] = p
            return torch.frombuffer(raw, dtype=torch.uint8)
        buf = torch.frombuffer(raw, dtype=torch.uint8)
        if not n:
            pass
        elif p.is_contiguous():
            _memmove(buf.data_ptr() + h, p.data_ptr(), n)
        else:
            buf[h : self.nbytes].copy_(tensor_bytes(p))
        return buf


def head_struct(ndim: int) -> struct.Struct:
    """The header layout for ``ndim`` dimensions: meta, shape, zero padding to ``ALIGN``."""
    st = HEADS.get(ndim)
    if st is None:
        pad = aligned(HEADER + 8 * ndim) - HEADER - 8 * ndim
        st = HEADS[ndim] = struct.Struct(f"<qBBB5x{ndim}q{pad}x")
    return st


HEADS: dict[int, struct.Struct] = {}


def head(tag: Tag, payload_len: int, code: int = 0, shape: tuple[int, ...] = ()) -> bytes:
    if not shape:
        return _META.pack(HEADER + payload_len, tag, code, 0)
    st = head_struct(len(shape))
    return st.pack(st.size + payload_len, tag, code, len(shape), *shape)


def frame_length(buf: torch.Tensor) -> int:
    """The length of the frame written at the start of ``buf`` (CPU uint8)."""
    value: int = LENGTH.unpack(string_at(host(buf).data_ptr(), 8))[0]
    return value


def read_head(ptr: int) -> tuple[int, int, int, tuple[int, ...]]:
    """Length, tag, code and shape of the frame at address ``ptr``."""
    length, tag, code, ndim = _META.unpack(string_at(ptr, HEADER))
    if not ndim:
        return length, tag, code, ()
    return length, tag, code, head_struct(ndim).unpack(string_at(ptr, aligned(HEADER + 8 * ndim)))[4:]


def peek(buf: torch.Tensor) -> tuple[Tag, int, tuple[int, ...]]:
    """Tag, dtype/error code and shape of the frame at the start of ``buf``."""
    _, tag, code, shape = read_head(host(buf).data_ptr())
    return Tag(tag), code, shape


def payload_start(ndim: int) -> int:
    return aligned(HEADER + 8 * ndim)
