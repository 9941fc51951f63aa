"""SUM / AVERAGE of Python numbers in one small float64 all_reduce, when that is exact.

A group starts in mode ``"pair"``: each rank contributes ``[kind code, value]``. The summed
codes tell every rank how many ranks passed which kind; ints below 2**40 sum exactly in any
order, and two floats sum to the rank-order left fold. Once every rank passed small ints
(or, on two ranks, floats), the group expects that kind again and sends one element:
the value, or NaN from a rank whose value is not of that kind (NaN poisons the sum, so
every rank sees the miss). A one-element all_reduce is a single message on gloo; two
elements cost a ring. Whenever the result cannot be exact (mixed kinds, a bad value, big
ints, floats on 3+ ranks, a NaN) every rank sees it from the same sum and takes the general
path: gather every value and fold in rank order. The next mode follows from what every rank
saw, so all ranks agree on it. See docs/design.md, "Python numbers".
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from ._errors import IdistError
from ._reduce import check_value_op

#: the pair path is used for groups of 2 .. MAX_RANKS - 1 ranks
MAX_RANKS = 1 << 13
#: ints strictly inside ±SMALL_INT take the fast paths
SMALL_INT = 1 << 40
#: kind codes: fewer than MAX_RANKS ranks, so each kind's count is one base-MAX_RANKS digit
_INT, _FLOAT, _OTHER = 1.0, float(MAX_RANKS), float(MAX_RANKS**2)
OPS = ("SUM", "AVERAGE")

#: how a group's next SUM of Python numbers moves (the same on every rank of the group)
Mode = Literal["pair", "int", "float", "gather"]


class Miss:
    """The all_reduce could not give the exact result: gather."""


MISS = Miss()


def _small_int(x: object) -> bool:
    return type(x) is int and -SMALL_INT < x < SMALL_INT


def _valid(x: object, op: str) -> bool:
    try:
        check_value_op(op, x)
    except IdistError:
        return False
    return True


def contribution(x: object, op: str, mode: Mode) -> torch.Tensor:
    """This rank's float64 tensor to SUM for ``x`` in ``mode`` ("pair", "int" or "float")."""
    if mode == "pair":
        if not _valid(x, op):
            return torch.tensor([_OTHER, 0.0], dtype=torch.float64)
        if type(x) is float:
            return torch.tensor([_FLOAT, x], dtype=torch.float64)
        if _small_int(x):
            return torch.tensor([_INT, x], dtype=torch.float64)
        return torch.tensor([_OTHER, 0.0], dtype=torch.float64)
    fits = _small_int(x) if mode == "int" else type(x) is float
    return torch.tensor(x if fits and _valid(x, op) else math.nan, dtype=torch.float64)


def result(summed: torch.Tensor, n: int, op: str, mode: Mode) -> int | float | Miss:
    """The exact result from the sum over ``n`` ranks in ``mode``, or ``MISS``."""
    if mode == "pair":
        code, value = (float(v) for v in summed.tolist())
        if code == n * _INT:  # ints only
            return int(value)
        if n == 2 and code == 2 * _FLOAT:  # two floats
            return value / 2 if op == "AVERAGE" else value
        return MISS
    value = float(summed.item())
    if math.isnan(value):
        return MISS
    if mode == "int":
        return int(value)
    return value / 2 if op == "AVERAGE" else value


def after_sum(value: int | float, n: int) -> Mode:
    """The mode after an exact sum: the kind every rank passed."""
    return "int" if type(value) is int else "float" if n == 2 else "pair"


def after_gather(values: list[object]) -> Mode:
    """The mode after a gathered sum, from the values every rank saw."""
    if all(_small_int(v) for v in values):
        return "int"
    if all(type(v) is float for v in values):
        return "float" if len(values) == 2 else "gather"
    return "pair"
