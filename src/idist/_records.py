"""Python numbers for all_reduce as 16-byte records, exchanged in one all-to-all.

Each rank sends its record (a tag, then a float's bits, an int64 or a bool) to every rank,
so every rank folds every rank's exact value in rank order (``_reduce.fold_values``): the
same bits on every rank. A value no record holds (a numpy scalar, an int past int64, a value
all_reduce refuses) is sent as ``OTHER``, and every rank then gathers full frames instead.

Why an all-to-all: it is gloo's fastest small collective on two ranks, and it never pairs
with another call's messages. A peer that passed a tensor waits in a tensor all_reduce, and
the native guard reports both calls on every rank (``_backends/native/_crossed.py``); an
all_reduce of the record would have mixed the peer's tensor bytes in, or made gloo abort.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence

import torch

from ._errors import CollectiveMismatchError
from ._reduce import INT64_MAX, INT64_MIN

#: record tags: a value of the tag's type follows, or OTHER (gather frames)
OTHER, FLOAT, INT, BOOL = 0, 1, 2, 3
#: the op travels in the record's second byte, so that ranks passing different ops all raise
OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AND", "OR", "AVERAGE")
_FLOAT_RECORD = struct.Struct("<Qd")
_INT_RECORD = struct.Struct("<Qq")
SIZE = _FLOAT_RECORD.size
_F64, _I64 = struct.Struct("<d"), struct.Struct("<q")
_string_at = ctypes.string_at


def record(x: object, op: str) -> bytes:
    """This rank's record for ``x`` reduced with ``op``."""
    kind, code = type(x), (OPS.index(op) if op in OPS else 255) << 8
    if kind is float:
        return _FLOAT_RECORD.pack(FLOAT | code, x)
    if kind is int and INT64_MIN <= x <= INT64_MAX:  # type: ignore[operator]  # x is an int here
        return _INT_RECORD.pack(INT | code, x)
    if kind is bool:
        return _INT_RECORD.pack(BOOL | code, int(x))  # type: ignore[call-overload]  # x is a bool here
    return _INT_RECORD.pack(OTHER | code, 0)


def exchange(
    swap: Callable[[torch.Tensor, torch.Tensor], None], ranks: Sequence[int], x: object, op: str
) -> list[object] | None:
    """Every rank's number, in group rank order, through ``swap(out, send)`` (an all-to-all of
    equal parts); None when some rank sent ``OTHER`` (every rank sees the same). Ranks that
    passed different ops all raise ``CollectiveMismatchError``."""
    n = len(ranks)
    out = torch.empty(n * SIZE, dtype=torch.uint8)
    swap(out, torch.frombuffer(bytearray(record(x, op) * n), dtype=torch.uint8))
    data = _string_at(out.data_ptr(), n * SIZE)
    if any(data[at + 1] != data[1] for at in range(SIZE, n * SIZE, SIZE)):
        said = ", ".join(f"rank {r} {_op(data[i * SIZE + 1])}" for i, r in enumerate(ranks))
        raise CollectiveMismatchError(f"all_reduce got different ops on different ranks ({said}); pass the same op")
    values: list[object] = []
    for at in range(0, n * SIZE, SIZE):
        tag = data[at]
        if tag == FLOAT:
            values.append(_F64.unpack_from(data, at + 8)[0])
        elif tag == INT:
            values.append(_I64.unpack_from(data, at + 8)[0])
        elif tag == BOOL:
            values.append(data[at + 8] == 1)
        else:
            return None
    return values


def _op(code: int) -> str:
    return OPS[code] if code < len(OPS) else "another op"
