"""Strategies, reference folds and comparisons shared by the property suites.

Everything here is written from the documented semantics (docs/semantics.md), not from idist's code, so a property
compares idist against an independent statement of the contract.
"""

from __future__ import annotations

import functools
import math
import operator
import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path, PurePath
from typing import Any, TypeVar

import torch
from hypothesis import strategies as st

import idist

T = TypeVar("T")
V = TypeVar("V")

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

#: the dtypes the semantics name for all_reduce
REDUCE_DTYPES = (torch.int32, torch.int64, torch.float32, torch.float64, torch.bool)
#: every dtype a tensor may have in all_gather / broadcast
MOVE_DTYPES = (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128,
    torch.uint16, torch.uint32, torch.uint64,
)  # fmt: skip
OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVERAGE", "AND", "OR")


def valid_ops(dtype: torch.dtype) -> tuple[str, ...]:
    """AVERAGE on floating point only; AND/OR on bool and integers; bool has no SUM/PRODUCT."""
    if dtype == torch.bool:
        return ("MIN", "MAX", "AND", "OR")
    if dtype.is_floating_point:
        return ("SUM", "PRODUCT", "MIN", "MAX", "AVERAGE")
    return ("SUM", "PRODUCT", "MIN", "MAX", "AND", "OR")


def value_ops(kind: type) -> tuple[str, ...]:
    if kind is bool:
        return ("MIN", "MAX", "AND", "OR")
    if kind is float:
        return ("SUM", "PRODUCT", "MIN", "MAX", "AVERAGE")
    return ("SUM", "PRODUCT", "MIN", "MAX", "AND", "OR")


# ------------------------------------------------------------ outcomes per rank
def outcome(call: Callable[[], T]) -> tuple[str, T | str]:
    """``("ok", value)`` or ``("err", "<ExceptionClass>")``: lets a rank report an expected error."""
    try:
        return ("ok", call())
    except idist.IdistError as exc:
        return ("err", type(exc).__name__)


def same_error_everywhere(results: Sequence[tuple[str, object]], name: str) -> None:
    """Every rank raised the idist error ``name`` (no rank returned, no rank hung)."""
    assert [r[0] for r in results] == ["err"] * len(results), results
    assert {r[1] for r in results} == {name}, results


# --------------------------------------------------------------- bit equality
def float_bits(x: float) -> bytes:
    return struct.pack("<d", x)


def same_value(a: Any, b: Any) -> bool:
    """Exact equality: same type, floats bit for bit (NaN == NaN with the same bits), recursive."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return float_bits(a) == float_bits(b)
    if isinstance(a, torch.Tensor):
        return same_tensor(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    return bool(a == b)


def raw(t: torch.Tensor) -> bytes:
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    return bytes(flat.tolist())


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes."""
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and raw(a) == raw(b)


def equal_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype and shape, equal by value (NaN matches NaN, -0.0 matches 0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(torch.equal(a, b)) or bool(
        ((a == b) | (torch.isnan(a) & torch.isnan(b))).all() if a.dtype.is_floating_point else False
    )


# ------------------------------------------------------------ reference folds
def fold_tensors(op: str, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """the contract's meaning of each op, elementwise over the ranks' tensors (rank order)."""
    dtype = tensors[0].dtype
    if dtype in (torch.uint16, torch.uint32):
        # torch has no arithmetic kernels for these: fold the same values in int64
        return fold_tensors(op, [t.to(torch.int64) for t in tensors]).to(dtype)
    if dtype == torch.uint64:
        return _fold_uint64(op, tensors)
    acc = _left_fold(op, [tensors[0].clone(), *tensors[1:]], torch.minimum, torch.maximum)
    if op == "AVERAGE":
        acc = acc / len(tensors)
    return acc.to(tensors[0].dtype)


def _left_fold(op: str, values: Sequence[V], minimum: Callable[[V, V], V], maximum: Callable[[V, V], V]) -> V:
    """``values`` folded left to right with ``op`` (AVERAGE: the sum); ``minimum``/``maximum`` for MIN/MAX."""
    steps: dict[str, Callable[[V, V], V]] = {
        "SUM": operator.add, "AVERAGE": operator.add, "PRODUCT": operator.mul,
        "MIN": minimum, "MAX": maximum, "AND": operator.and_, "OR": operator.or_,
    }  # fmt: skip
    return functools.reduce(steps[op], values[1:], values[0])


def _fold_uint64(op: str, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """uint64 element by element with Python ints (torch has few uint64 kernels): unsigned
    values, SUM/PRODUCT modulo 2**64."""
    rows = [[v % 2**64 for v in t.contiguous().view(torch.int64).reshape(-1).tolist()] for t in tensors]
    folds: dict[str, Any] = {
        "SUM": lambda a, b: (a + b) % 2**64, "PRODUCT": lambda a, b: (a * b) % 2**64,
        "MIN": min, "MAX": max, "AND": lambda a, b: a & b, "OR": lambda a, b: a | b,
    }  # fmt: skip
    out = [functools.reduce(folds[op], column) for column in zip(*rows, strict=True)]
    signed = torch.tensor([v - 2**64 if v > INT64_MAX else v for v in out], dtype=torch.int64)
    return signed.view(torch.uint64).reshape(tensors[0].shape)


def fold_numbers(op: str, values: Sequence[Any]) -> Any:
    """for Python numbers: exact, left to right in rank order; MIN/MAX propagate NaN."""
    if op in ("MIN", "MAX") and isinstance(values[0], float):
        if any(math.isnan(v) for v in values):
            return math.nan
        best = values[0]
        for v in values[1:]:
            if (v < best) if op == "MIN" else (v > best):
                best = v
        return best
    acc = _left_fold(op, values, min, max)
    if op == "AVERAGE":
        return acc / len(values)
    return type(values[0])(acc)


# ------------------------------------------------------------------ strategies
def shapes(max_dims: int = 3, max_side: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes with 0..max_dims dims, sides 0..max_side (so empty tensors are common)."""
    return st.lists(st.integers(0, max_side), max_size=max_dims).map(tuple)


def exact_floats() -> st.SearchStrategy[float]:
    """Floats whose sums and products over <= 8 ranks are exact in float32 in any order,
    plus -0.0 and the infinities (whose sums do not depend on the order either)."""
    small = st.builds(lambda m, e: m * 2.0**e, st.integers(-15, 15), st.integers(-3, 3))
    return st.one_of(small, st.sampled_from([0.0, -0.0, math.inf, -math.inf]))


def tensor_values(dtype: torch.dtype) -> st.SearchStrategy[Any]:
    """Element values for reference-fold properties (exact under any reduction order)."""
    if dtype == torch.bool:
        return st.booleans()
    if dtype.is_floating_point:
        return exact_floats()
    info = torch.iinfo(dtype)
    # any int: integer SUM/PRODUCT wrap identically in every order (two's complement)
    return st.integers(info.min, info.max)


def make_tensor(dtype: torch.dtype, shape: tuple[int, ...], values: Sequence[Any]) -> torch.Tensor:
    return torch.tensor(list(values), dtype=dtype).reshape(shape)


def random_bits(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """A tensor of ``dtype``/``shape`` whose bytes are random (any NaN payload, any bool byte 0/1)."""
    n = math.prod(shape)
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    itemsize = torch.empty((), dtype=dtype).element_size()
    data = torch.randint(0, 256, (n * itemsize,), generator=g, dtype=torch.uint8)
    return data.view(dtype).reshape(shape)


def any_text() -> st.SearchStrategy[str]:
    """Any Python str, lone surrogates included."""
    return st.text(st.characters(exclude_categories=()), max_size=40)


def int64s() -> st.SearchStrategy[int]:
    """Any int64, with the edges (where sums and products leave the range) drawn often."""
    edges = [INT64_MAX, INT64_MIN, INT64_MAX // 2 + 1, -(2**62), 2**32, -(2**31), 3_037_000_500, -1, 0, 1]
    return st.one_of(st.sampled_from(edges), st.integers(INT64_MIN, INT64_MAX))


def any_float() -> st.SearchStrategy[float]:
    return st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)


def any_path() -> st.SearchStrategy[Path]:
    # lone surrogates: U+DCxx the OS can name (surrogateescape), U+D800 it cannot
    return st.one_of(any_text().map(Path), st.sampled_from([Path("a/\udcff"), Path("\ud800/x")]))


def plain_values() -> st.SearchStrategy[Any]:
    """Every type the codec moves without pickle, plus picklable containers."""
    scalars = st.one_of(
        st.integers(),
        st.integers(-(2**200), 2**200),
        any_float(),
        st.booleans(),
        any_text(),
        st.binary(max_size=64),
        any_path(),
        st.none(),
    )
    containers = st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
        max_leaves=6,
    )  # fmt: skip
    return st.one_of(scalars, containers, st.tuples(scalars, scalars))


def encodable(v: Any) -> bool:
    """False for a path the OS cannot name (a lone surrogate outside surrogateescape's range)."""
    if isinstance(v, PurePath):
        try:
            os.fsencode(v)
        except UnicodeEncodeError:
            return False
    return True  # inside a container the path is pickled, which takes any str
