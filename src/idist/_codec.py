"""Value encoding: every value a collective moves becomes one *frame* (``_frame``).

The payload is exact: ints as arbitrary-length signed bytes, floats as their 8 IEEE bytes,
str as UTF-8 (``surrogatepass``, so any Python str round-trips), bytes and paths raw,
tensors as their raw memory. Only values of other types go through pickle (peers are
trusted). Nothing here calls numpy or ``eval``.
"""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path, PurePath, PurePosixPath, PureWindowsPath

import attrs
import torch

from . import _reports
from ._errors import CODE_OF, ERROR_CODES, IdistError, UnsupportedValueError
from ._frame import HEADER, LENGTH, Frame, Tag, aligned, head, host, read_head, string_at

_F64 = struct.Struct("<d")

DTYPES: tuple[torch.dtype, ...] = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.uint16,
    torch.uint32,
    torch.uint64,
)
DTYPE_CODE: dict[torch.dtype, int] = {dt: i for i, dt in enumerate(DTYPES)}


def _plain(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the CPU with its lazy conjugate/negative bits applied, so its memory is its value."""
    if not t.is_cpu:
        t = t.cpu()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    return t


def _raw(tag: Tag, payload: bytes, code: int = 0) -> Frame:
    return Frame(head(tag, len(payload), code), payload)


def _tensor_code(t: torch.Tensor) -> int:
    if t.is_meta:
        raise UnsupportedValueError(
            "cannot use a tensor on the meta device: it has a shape but no data; materialize it "
            "(torch.empty_like(t, device='cpu')) or pass a real tensor"
        )
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
    return Frame(head(Tag.TENSOR, data.numel() * data.element_size(), code, tuple(t.shape)), data)


def tensor_header(t: torch.Tensor) -> Frame:
    """A frame with ``t``'s dtype and shape but no payload: the data moves separately."""
    return Frame(head(Tag.TENSOR, 0, _tensor_code(t), tuple(t.shape)), b"")


@attrs.frozen
class ReduceHeader:
    """What a rank announces before it reduces a tensor: the op, the tensor's dtype and shape."""

    op: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.op} of {self.dtype} {list(self.shape)}"


def reduce_header(op: str, t: torch.Tensor) -> Frame:
    """``ReduceHeader(op, t.dtype, t.shape)`` as a frame; equal headers are equal bytes."""
    return Frame(head(Tag.REDUCE, len(op), _tensor_code(t), tuple(t.shape)), op.encode("ascii"))


#: the path classes that move as their bytes; the code byte says which (0: this system's ``Path``)
_PATHS: tuple[type[PurePath], ...] = (type(Path()), PurePosixPath, PureWindowsPath)
_PATH_CODE = {cls: code for code, cls in enumerate(_PATHS)}


def encode(value: object, *, allow_pickle: bool = True) -> Frame:
    """Encode ``value``; raises ``UnsupportedValueError`` for a type that cannot move.

    Only the exact types move as raw bytes, so that every rank decodes the type that was
    sent: a subclass (an ``IntEnum``, a ``StrEnum``, numpy's ``float64``) is pickled.
    """
    kind = type(value)
    if isinstance(value, torch.Tensor):
        return encode_tensor(value)
    if value is None:
        return _raw(Tag.NONE, b"")
    if kind is bool:
        return _raw(Tag.BOOL, b"\x01" if value else b"\x00")
    if isinstance(value, int) and kind is int:
        return _raw(Tag.INT, value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True))
    if isinstance(value, float) and kind is float:
        return _raw(Tag.FLOAT, _F64.pack(value))
    if isinstance(value, str) and kind is str:
        return _raw(Tag.STR, value.encode("utf-8", "surrogatepass"))
    if isinstance(value, (bytes, bytearray)) and kind in (bytes, bytearray):
        return _raw(Tag.BYTES, bytes(value), int(kind is bytearray))
    if isinstance(value, memoryview):
        raise UnsupportedValueError(
            "cannot move a memoryview: no rank could get one back; send bytes(view) or bytearray(view)"
        )
    if isinstance(value, PurePath) and kind in _PATH_CODE:
        try:
            return _raw(Tag.PATH, os.fsencode(value), _PATH_CODE[kind])
        except UnicodeEncodeError as exc:  # a lone surrogate no file system can name
            raise UnsupportedValueError(
                f"cannot move path {str(value)!r}: the file system encoding cannot represent it ({exc.reason}); "
                "send str(path) instead"
            ) from exc
    if not allow_pickle:
        raise UnsupportedValueError(f"cannot move a value of type {kind.__name__} here")
    try:
        return _raw(Tag.PICKLE, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as exc:
        raise UnsupportedValueError(
            f"cannot move a value of type {kind.__name__}: it does not pickle ({exc}); "
            "send a tensor, a number, str, bytes, a Path or a picklable object"
        ) from exc


def encode_error(exc: IdistError) -> Frame:
    """An error frame: every rank that decodes it raises ``exc``'s class (or its nearest
    ancestor with a code) with ``exc``'s text, cut to ``_reports.LIMIT`` bytes: every rank
    gathers the frame, so a message of any length must not travel whole."""
    code = next((CODE_OF[c] for c in type(exc).__mro__ if c in CODE_OF), CODE_OF[UnsupportedValueError])
    return _raw(Tag.ERROR, _reports.cut(str(exc)).encode("utf-8", "replace"), code)


_NONE, _BOOL, _INT, _FLOAT, _STR, _BYTES, _PATH, _TENSOR, _PICKLE, _REDUCE = (
    int(Tag.NONE),
    int(Tag.BOOL),
    int(Tag.INT),
    int(Tag.FLOAT),
    int(Tag.STR),
    int(Tag.BYTES),
    int(Tag.PATH),
    int(Tag.TENSOR),
    int(Tag.PICKLE),
    int(Tag.REDUCE),
)


def decode_error(buf: torch.Tensor) -> IdistError:
    """The error an error frame (``peek`` said so) ships."""
    value = decode(buf)
    if not isinstance(value, IdistError):
        raise TypeError(f"expected an error frame, got {type(value).__name__}")
    return value


def decode_tensor(buf: torch.Tensor) -> torch.Tensor:
    """Decode a frame known to hold a tensor (``peek`` said so)."""
    value = decode(buf)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"expected a tensor frame, got {type(value).__name__}")
    return value


def _unpickle(raw: bytes) -> object:
    try:
        return pickle.loads(raw)
    except Exception as exc:
        raise UnsupportedValueError(
            f"a value did not unpickle ({type(exc).__name__}: {exc}); every rank must be able to import "
            "its class and rebuild it"
        ) from exc


def numbers(out: torch.Tensor, size: int, n: int) -> list[object] | None:
    """The Python numbers in the ``n`` frames at every ``size`` bytes of ``out`` (CPU, contiguous),
    or None when a frame holds anything else (``decode`` it)."""
    data = string_at(out.data_ptr(), n * size)
    values: list[object] = []
    for at in range(0, n * size, size):
        tag = data[at + 8]
        if tag == _FLOAT:
            values.append(_F64.unpack_from(data, at + HEADER)[0])
        elif tag == _INT:
            values.append(
                int.from_bytes(data[at + HEADER : at + LENGTH.unpack_from(data, at)[0]], "little", signed=True)
            )
        elif tag == _BOOL:
            values.append(data[at + HEADER] == 1)
        else:
            return None
    return values


def decode(buf: torch.Tensor) -> object:
    """Decode the frame at the start of ``buf`` (CPU uint8). A shipped error is returned, not
    raised (``is_error`` tells it from a value); a pickle that does not load raises
    ``UnsupportedValueError``.

    A tensor comes back as a view of ``buf``'s memory (no copy).
    """
    buf = host(buf)
    ptr = buf.data_ptr()
    length, tag, code, shape = read_head(ptr)
    start = aligned(HEADER + 8 * len(shape))
    if tag == _TENSOR:
        dtype = DTYPES[code]
        if length == start:
            return torch.empty(shape, dtype=dtype)
        flat = buf[start:length].view(dtype)
        return flat if len(shape) == 1 else flat.view(shape)
    raw = string_at(ptr + start, length - start) if length > start else b""
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
        return bytearray(raw) if code else raw
    if tag == _PATH:
        return _PATHS[code](os.fsdecode(raw))
    if tag == _PICKLE:
        return _unpickle(raw)
    if tag == _REDUCE:
        return ReduceHeader(raw.decode("ascii"), DTYPES[code], shape)
    Tag(tag)  # an unknown tag raises ValueError here
    return ERROR_CODES.get(code, UnsupportedValueError)(raw.decode("utf-8", "replace"))
