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


def check_value_op(op: str, value: object) -> None:
    """Validate ``op`` against a Python number; raises on anything else."""
    valid: tuple[str, ...]
    if isinstance(value, bool):
        valid = BOOL_OPS
        hint = "; to count True values reduce int(flag) with SUM" if op in ("SUM", "AVERAGE") else ""
    elif isinstance(value, int):
        valid, hint = INT_OPS, ("; reduce float(x) for an average" if op == "AVERAGE" else "")
    elif isinstance(value, float):
        valid, hint = FLOAT_OPS, ""
    else:
        raise UnsupportedValueError(
            f"all_reduce takes a tensor, int, float or bool, not {type(value).__name__}; "
            "use all_gather for other values"
        )
    if op not in valid:
        raise _reject(op, type(value).__name__, valid, hint)
    if type(value) is int and not INT64_MIN <= value <= INT64_MAX:
        raise ReduceOverflowError(f"int input {value} is outside int64; all_reduce works in int64")


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
_FOLDS: dict[str, Callable[..., object]] = {
    "SUM": operator.add,
    "PRODUCT": operator.mul,
    "MIN": _nan_aware(_min),
    "MAX": _nan_aware(_max),
    "AND": operator.and_,
    "OR": operator.or_,
    "AVERAGE": operator.add,
}


def fold_values(op: str, values: Sequence[object]) -> object:
    """Fold the ranks' values (already validated, all of one type) in rank order."""
    kind = type(values[0])
    mixed = sorted({type(v).__name__ for v in values})
    if len(mixed) > 1:
        raise UnsupportedValueError(
            f"all_reduce got values of types {', '.join(mixed)} on different ranks; "
            "pass the same Python type on every rank"
        )
    # Left fold in rank order, the same on every rank; SUM uses plain float addition.
    result = reduce(_FOLDS[op], values)
    if kind is float and op == "AVERAGE" and isinstance(result, float):
        return result / len(values)
    if kind is bool:
        return bool(result)
    if isinstance(result, int) and kind is int and not INT64_MIN <= result <= INT64_MAX:
        raise ReduceOverflowError(
            f"all_reduce({op}) of ints overflows int64 (exact result {result}); reduce float(x) or split the value"
        )
    return result
