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


class Frame:
    """One encoded value, not yet placed in a buffer."""

    __slots__ = ("head", "nbytes", "payload")

    def __init__(self, head: bytes, payload: torch.Tensor | bytes) -> None:
        self.head = head
        self.payload = payload
        n = payload.numel() if isinstance(payload, torch.Tensor) else len(payload)
        self.nbytes = len(head) + n

    def write(self, buf: torch.Tensor) -> None:
        """Write the frame at the start of ``buf`` (a CPU uint8 tensor at least ``nbytes`` long)."""
        h = len(self.head)
        buf[:h].copy_(torch.frombuffer(bytearray(self.head), dtype=torch.uint8))
        p = self.payload
        if isinstance(p, torch.Tensor):
            buf[h : self.nbytes].copy_(p)
        elif p:
            buf[h : self.nbytes].copy_(torch.frombuffer(bytearray(p), dtype=torch.uint8))

    def to_tensor(self) -> torch.Tensor:
        buf = torch.empty(self.nbytes, dtype=torch.uint8)
        self.write(buf)
        return buf


def _head(tag: Tag, payload_len: int, code: int = 0, shape: tuple[int, ...] = ()) -> bytes:
    start = aligned(HEADER + 8 * len(shape))
    meta = _META.pack(start + payload_len, tag, code, len(shape))
    dims = b"".join(_LEN.pack(d) for d in shape)
    return meta + dims + bytes(start - HEADER - len(dims))


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


def encode_tensor(t: torch.Tensor) -> Frame:
    data = tensor_bytes(t.cpu() if t.device.type != "cpu" else t)
    return Frame(_head(Tag.TENSOR, data.numel(), _tensor_code(t), tuple(t.shape)), data)


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
        return _raw(Tag.PATH, os.fsencode(value))
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
    value: int = _LEN.unpack(as_bytes(buf[:8]))[0]
    return value


def peek(buf: torch.Tensor) -> tuple[Tag, int, tuple[int, ...]]:
    """Tag, dtype/error code and shape of the frame at the start of ``buf``."""
    _, tag, code, ndim = _META.unpack(as_bytes(buf[:HEADER]))
    raw = as_bytes(buf[HEADER : HEADER + 8 * ndim])
    shape = tuple(_LEN.unpack_from(raw, 8 * i)[0] for i in range(ndim))
    return Tag(tag), code, shape


def payload_start(ndim: int) -> int:
    return aligned(HEADER + 8 * ndim)


def decode(buf: torch.Tensor) -> object:
    """Decode the frame at the start of ``buf`` (CPU uint8). Errors are returned, not raised."""
    tag, code, shape = peek(buf)
    start = payload_start(len(shape))
    body = buf[start : frame_length(buf)]
    if tag is Tag.TENSOR:
        dtype = DTYPES[code]
        if body.numel() == 0:
            return torch.empty(shape, dtype=dtype)
        return body.view(dtype).reshape(shape)
    raw = as_bytes(body)
    if tag is Tag.NONE:
        return None
    if tag is Tag.BOOL:
        return raw == b"\x01"
    if tag is Tag.INT:
        return int.from_bytes(raw, "little", signed=True)
    if tag is Tag.FLOAT:
        value: float = _F64.unpack(raw)[0]
        return value
    if tag is Tag.STR:
        return raw.decode("utf-8", "surrogatepass")
    if tag is Tag.BYTES:
        return raw
    if tag is Tag.PATH:
        return Path(os.fsdecode(raw))
    if tag is Tag.PICKLE:
        return pickle.loads(raw)
    return ERROR_CODES.get(code, UnsupportedValueError)(raw.decode("utf-8", "replace"))
