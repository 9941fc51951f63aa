"""Reduce-op rules: which op is valid for which data, and the exact fold of Python values.

Python numbers are reduced by gathering every rank's exact value and folding them here,
in rank order, with Python arithmetic: float64 and int64 results are exact and the same
bit for bit on every rank, and an int result outside int64 is an error, not a wrap.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from functools import reduce
from typing import Literal

import numpy as np
import torch

from ._errors import ReduceOverflowError, UnsupportedOpError, UnsupportedValueError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

FLOAT_OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVERAGE")
INT_OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AND", "OR")
BOOL_OPS = ("AND", "OR", "MIN", "MAX")
COMPLEX_OPS = ("SUM", "AVERAGE")


def check_op_name(op: object, valid: Sequence[str], backend: str) -> str:
    """Reject an op the backend does not know before any communication."""
    if not isinstance(op, str) or op not in valid:
        raise UnsupportedOpError(f"unknown reduce op {op!r} for backend {backend!r}; valid ops: {', '.join(valid)}")
    return op


def _reject(op: str, what: str, valid: Sequence[str], hint: str = "") -> UnsupportedOpError:
    return UnsupportedOpError(f"op {op!r} is not valid for {what}; valid ops for it: {', '.join(valid)}{hint}")


def ops_for_dtype(dtype: torch.dtype) -> tuple[str, ...]:
    if dtype == torch.bool:
        return BOOL_OPS
    if dtype.is_complex:
        return COMPLEX_OPS
    if dtype.is_floating_point:
        return FLOAT_OPS
    return INT_OPS


def check_tensor_op(op: str, dtype: torch.dtype) -> None:
    valid = ops_for_dtype(dtype)
    if op not in valid:
        raise _reject(op, f"{dtype} tensors", valid)


#: the kind of each Python number all_reduce takes: what it reduces as
Kind = Literal["bool", "int", "float"]
#: Python ints also AVERAGE (into a float: a ``float`` variable may hold an int); int tensors cannot
_VALID: dict[str, tuple[str, ...]] = {"bool": BOOL_OPS, "int": (*INT_OPS, "AVERAGE"), "float": FLOAT_OPS}


_PYTHON_KINDS: dict[type, Kind] = {bool: "bool", int: "int", float: "float"}


def number_kind(x: object) -> Kind | None:
    """How all_reduce reduces ``x``: bool, int and float, and the numpy scalars that stand for them."""
    kind = _PYTHON_KINDS.get(type(x))
    if kind is not None or not isinstance(x, np.generic):
        return kind
    if isinstance(x, np.bool_):
        return "bool"
    if isinstance(x, np.integer):
        return "int"
    if isinstance(x, np.floating) and x.itemsize <= 8:
        return "float"
    return None


def check_number(x: object) -> None:
    """What one rank can tell alone about its value for all_reduce (the collective ships it)."""
    if type(x) is float or type(x) is bool:
        return  # the common cases first, without the numpy checks below
    if isinstance(x, int) and type(x) is int and INT64_MIN <= x <= INT64_MAX:
        return
    kind = number_kind(x)
    if kind is None:
        what = type(x).__name__
        hint = f"; pass int(x) or float(x) for a {what}" if isinstance(x, (int, float, np.number)) else ""
        raise UnsupportedValueError(
            f"all_reduce takes a tensor, an int, a float, a bool or a numpy scalar of one, not {what}{hint}; "
            "use all_gather for other values"
        )
    if kind == "int" and not INT64_MIN <= (n := as_python("int", x)) <= INT64_MAX:
        raise ReduceOverflowError(f"int input {n} is outside int64; all_reduce works in int64")


def as_python(kind: Kind, x: object) -> int | float:
    """The Python number ``x`` (of ``number_kind`` kind or int below float) stands for, as ``kind``."""
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return float(x) if kind == "float" else int(x)
    if isinstance(x, (float, np.floating)):
        return float(x)
    raise TypeError(f"not a number: {type(x).__name__}")


def check_value_op(op: str, value: object) -> None:
    """Validate ``op`` against one rank's Python number (a group of one); raises on anything else."""
    check_number(value)
    fold_values(op, [value])


def _nan_aware(pick: Callable[[float, float], float]) -> Callable[[float, float], float]:
    # MIN/MAX propagate NaN, as torch.minimum/maximum do; Python's min() would depend on order.
    def fold(a: float, b: float) -> float:
        if math.isnan(a):
            return a
        if math.isnan(b):
            return b
        return pick(a, b)

    return fold


def _min(a: float, b: float) -> float:
    return b if b < a else a


def _max(a: float, b: float) -> float:
    return b if b > a else a


# operator's functions, not lambdas: ``a * b`` in a lambda runs float_mul until CPython specializes
# the instruction, then its own multiply, and the two order a NaN's operands differently (NaN *
# NaN gives either sign): ranks whose folds straddle that moment (simulated ranks share the
# lambda) disagreed on the bits.
_FOLDS: dict[str, Callable[..., int | float]] = {
    "SUM": operator.add,
    "PRODUCT": operator.mul,
    "MIN": _nan_aware(_min),
    "MAX": _nan_aware(_max),
    "AND": operator.and_,
    "OR": operator.or_,
    "AVERAGE": operator.add,
}


def fold_values(op: str, values: Sequence[object]) -> object:
    """Fold the ranks' numbers (each passed ``check_number``) in rank order: the same on every rank.

    An int on some ranks and a float on others reduce as floats (``float(x)`` on every rank); a
    bool mixes with nothing. The result has the type every rank passed (a numpy scalar type
    included), else the Python type of the kind.
    """
    types = {type(v) for v in values}
    only = _PYTHON_KINDS.get(next(iter(types))) if len(types) == 1 else None
    kinds = {only} if only is not None else {number_kind(v) for v in values}
    if len(kinds) > 1 and "bool" in kinds:
        names = ", ".join(sorted({type(v).__name__ for v in values}))
        raise UnsupportedValueError(
            f"all_reduce got values of types {names} on different ranks; a bool reduces only with bools: "
            "pass the same type on every rank"
        )
    kind: Kind = "bool" if "bool" in kinds else "float" if "float" in kinds else "int"
    if op not in _VALID[kind]:
        what = "int and float (reduced as float)" if len(kinds) > 1 else kind
        hint = "; to count True values reduce int(flag) with SUM" if kind == "bool" and op in ("SUM", "AVERAGE") else ""
        raise _reject(op, what, _VALID[kind], hint)
    # Left fold in rank order, the same on every rank; SUM uses plain float addition.
    numbers = (
        [v for v in values if isinstance(v, (int, float))] if only is not None else [as_python(kind, v) for v in values]
    )
    result = numbers[0] if len(numbers) == 1 else reduce(_FOLDS[op], numbers)
    if op == "AVERAGE":  # of ints too: the exact sum, divided once (x / 1 would quiet a signalling NaN)
        mean = result / len(values) if len(values) > 1 else float(result)
        if only is not None or not all(issubclass(t, np.floating) for t in types):
            return mean  # a mean of ints is a float, numpy's too
        return _as_type(types, mean, op)
    if kind == "bool":
        result = bool(result)
    elif kind == "int" and not INT64_MIN <= result <= INT64_MAX:
        raise ReduceOverflowError(
            f"all_reduce({op}) of ints overflows int64 (exact result {result}); reduce float(x) or split the value"
        )
    return result if only is not None else _as_type(types, result, op)


def _as_type(types: set[type], result: int | float, op: str) -> object:
    """``result`` as the type every rank passed, when that is a numpy scalar type."""
    if len(types) != 1:
        return result
    (kind,) = types
    if not issubclass(kind, np.generic):
        return result
    if issubclass(kind, np.integer) and not np.iinfo(kind).min <= result <= np.iinfo(kind).max:
        raise ReduceOverflowError(
            f"all_reduce({op}) of {kind.__name__} overflows {kind.__name__} (exact result {result}); "
            "reduce int(x) (int64) instead"
        )
    return kind(result)
