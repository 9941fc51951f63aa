"""Value encoding: every value a collective moves becomes one *frame* of bytes.

A frame is a uint8 tensor laid out as::

    [0:8)    int64 little-endian: the frame's total length in bytes
    [8]      tag (what the value is, see ``Tag``)
    [9]      dtype code (tensors) / error code (errors)
    [10]     ndim (tensors)
    [11:16)  zero
    [16:16+8*ndim)  int64 shape (tensors), then zero padding to a multiple of 16
    [...]    payload

The payload is exact: ints as arbitrary-length signed bytes, floats as their 8 IEEE bytes,
str as UTF-8 (``surrogatepass``, so any Python str round-trips), bytes and paths raw,
tensors as their raw memory. Only values of other types go through pickle (peers are
trusted). Nothing here calls numpy or ``eval``.
"""

from __future__ import annotations

import ctypes
import enum
import os
import pickle
import struct
from pathlib import Path, PurePath

import torch

from ._errors import CODE_OF, ERROR_CODES, IdistError, UnsupportedValueError

HEADER = 16
ALIGN = 16
_LEN = struct.Struct("<q")
_META = struct.Struct("<qBBB5x")
_F64 = struct.Struct("<d")


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


DTYPES: tuple[torch.dtype, ...] = (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex64, torch.complex128, torch.uint16, torch.uint32, torch.uint64,
)  # fmt: skip
DTYPE_CODE: dict[torch.dtype, int] = {dt: i for i, dt in enumerate(DTYPES)}


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


_string_at = ctypes.string_at
_memmove = ctypes.memmove
#: payloads up to this size are copied with one memmove; larger ones with torch (threads)
_MEMMOVE_MAX = 1 << 20


def _host(buf: torch.Tensor) -> torch.Tensor:
    """``buf`` itself when its bytes can be read through ``data_ptr`` (CPU, contiguous)."""
    return buf if buf.is_cpu and buf.is_contiguous() else buf.cpu().contiguous()


def _plain(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the CPU with its lazy conjugate/negative bits applied, so its memory is its value."""
    if not t.is_cpu:
        t = t.cpu()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    return t


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


def _head_struct(ndim: int) -> struct.Struct:
    """The header layout for ``ndim`` dimensions: meta, shape, zero padding to ``ALIGN``."""
    st = _HEADS.get(ndim)
    if st is None:
        pad = aligned(HEADER + 8 * ndim) - HEADER - 8 * ndim
        st = _HEADS[ndim] = struct.Struct(f"<qBBB5x{ndim}q{pad}x")
    return st


_HEADS: dict[int, struct.Struct] = {}


def _head(tag: Tag, payload_len: int, code: int = 0, shape: tuple[int, ...] = ()) -> bytes:
    if not shape:
        return _META.pack(HEADER + payload_len, tag, code, 0)
    st = _head_struct(len(shape))
    return st.pack(st.size + payload_len, tag, code, len(shape), *shape)


def _raw(tag: Tag, payload: bytes, code: int = 0) -> Frame:
    return Frame(_head(tag, len(payload), code), payload)


def _tensor_code(t: torch.Tensor) -> int:
    code = DTYPE_CODE.get(t.dtype)
    if code is None or t.is_sparse:
        raise UnsupportedValueError(
            f"cannot move a tensor of dtype {t.dtype} (layout {t.layout}); "
            "convert it to a dense tensor of a standard dtype first"
        )
    return code


def checked_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t``, after the same dtype/layout check that encoding it would make."""
    _tensor_code(t)
    return t


def encode_tensor(t: torch.Tensor) -> Frame:
    code = _tensor_code(t)
    data = _plain(t)
    return Frame(_head(Tag.TENSOR, data.numel() * data.element_size(), code, tuple(t.shape)), data)


def tensor_header(t: torch.Tensor) -> Frame:
    """A frame with ``t``'s dtype and shape but no payload: the data moves separately."""
    return Frame(_head(Tag.TENSOR, 0, _tensor_code(t), tuple(t.shape)), b"")


def encode(value: object, *, allow_pickle: bool = True) -> Frame:
    """Encode ``value``; raises ``UnsupportedValueError`` for a type that cannot move."""
    if isinstance(value, torch.Tensor):
        return encode_tensor(value)
    if value is None:
        return _raw(Tag.NONE, b"")
    if isinstance(value, bool):
        return _raw(Tag.BOOL, b"\x01" if value else b"\x00")
    if isinstance(value, int):
        n = (value.bit_length() + 8) // 8
        return _raw(Tag.INT, value.to_bytes(n, "little", signed=True))
    if isinstance(value, float):
        return _raw(Tag.FLOAT, _F64.pack(value))
    if isinstance(value, str):
        return _raw(Tag.STR, value.encode("utf-8", "surrogatepass"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _raw(Tag.BYTES, bytes(value))
    if isinstance(value, PurePath):
        try:
            return _raw(Tag.PATH, os.fsencode(value))
        except UnicodeEncodeError as exc:  # a lone surrogate no file system can name
            raise UnsupportedValueError(
                f"cannot move path {str(value)!r}: the file system encoding cannot represent it ({exc.reason}); "
                "send str(path) instead"
            ) from exc
    if not allow_pickle:
        raise UnsupportedValueError(f"cannot move a value of type {type(value).__name__} here")
    try:
        return _raw(Tag.PICKLE, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as exc:
        raise UnsupportedValueError(
            f"cannot move a value of type {type(value).__name__}: it does not pickle ({exc}); "
            "send a tensor, a number, str, bytes, a Path or a picklable object"
        ) from exc


def encode_error(exc: IdistError) -> Frame:
    code = CODE_OF.get(type(exc), CODE_OF[UnsupportedValueError])
    return _raw(Tag.ERROR, str(exc).encode("utf-8", "replace"), code)


def frame_length(buf: torch.Tensor) -> int:
    """The length of the frame written at the start of ``buf`` (CPU uint8)."""
    value: int = _LEN.unpack(_string_at(_host(buf).data_ptr(), 8))[0]
    return value


def _read_head(ptr: int) -> tuple[int, int, int, tuple[int, ...]]:
    """Length, tag, code and shape of the frame at address ``ptr``."""
    length, tag, code, ndim = _META.unpack(_string_at(ptr, HEADER))
    if not ndim:
        return length, tag, code, ()
    return length, tag, code, _head_struct(ndim).unpack(_string_at(ptr, aligned(HEADER + 8 * ndim)))[4:]


def peek(buf: torch.Tensor) -> tuple[Tag, int, tuple[int, ...]]:
    """Tag, dtype/error code and shape of the frame at the start of ``buf``."""
    _, tag, code, shape = _read_head(_host(buf).data_ptr())
    return Tag(tag), code, shape


def payload_start(ndim: int) -> int:
    return aligned(HEADER + 8 * ndim)


_NONE, _BOOL, _INT, _FLOAT, _STR, _BYTES, _PATH, _TENSOR, _PICKLE, _ERROR = (
    int(Tag.NONE), int(Tag.BOOL), int(Tag.INT), int(Tag.FLOAT), int(Tag.STR),
    int(Tag.BYTES), int(Tag.PATH), int(Tag.TENSOR), int(Tag.PICKLE), int(Tag.ERROR),
)  # fmt: skip


def decode(buf: torch.Tensor) -> object:
    """Decode the frame at the start of ``buf`` (CPU uint8). Errors are returned, not raised.

    A tensor comes back as a view of ``buf``'s memory (no copy).
    """
    buf = _host(buf)
    ptr = buf.data_ptr()
    length, tag, code, shape = _read_head(ptr)
    start = aligned(HEADER + 8 * len(shape))
    if tag == _TENSOR:
        dtype = DTYPES[code]
        if length == start:
            return torch.empty(shape, dtype=dtype)
        flat = buf[start:length].view(dtype)
        return flat if len(shape) == 1 else flat.view(shape)
    raw = _string_at(ptr + start, length - start) if length > start else b""
    if tag == _FLOAT:
        value: float = _F64.unpack(raw)[0]
        return value
    if tag == _INT:
        return int.from_bytes(raw, "little", signed=True)
    if tag == _STR:
        return raw.decode("utf-8", "surrogatepass")
    if tag == _BOOL:
        return raw == b"\x01"
    if tag == _NONE:
        return None
    if tag == _BYTES:
        return raw
    if tag == _PATH:
        return Path(os.fsdecode(raw))
    if tag == _PICKLE:
        return pickle.loads(raw)
    Tag(tag)  # an unknown tag raises ValueError here
    return ERROR_CODES.get(code, UnsupportedValueError)(raw.decode("utf-8", "replace"))
