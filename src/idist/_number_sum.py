"""SUM / AVERAGE of Python numbers in one two-element all_reduce, when that is exact.

Each rank contributes ``[kind code, value]`` (float64). The summed codes tell every rank
how many ranks passed which kind; ints below 2**40 sum exactly in any order, and two floats
sum to the rank-order left fold. Whenever the pair cannot give the exact result (mixed
kinds, a bad value, big ints, floats on 3+ ranks) every rank sees it from the same codes
and takes the general gather path. See docs/design.md, "Python numbers".
"""

from __future__ import annotations

import torch

from ._errors import IdistError
from ._reduce import check_value_op

#: the pair path is used for groups of 2 .. MAX_RANKS - 1 ranks
MAX_RANKS = 1 << 13
#: ints strictly inside ±SMALL_INT take the pair path
SMALL_INT = 1 << 40
#: kind codes: fewer than MAX_RANKS ranks, so each kind's count is one base-MAX_RANKS digit
_INT, _FLOAT, _OTHER = 1.0, float(MAX_RANKS), float(MAX_RANKS**2)
OPS = ("SUM", "AVERAGE")


class Miss:
    """The pair could not give the exact result: gather."""


MISS = Miss()


def pair(x: object, op: str) -> torch.Tensor:
    """This rank's ``[kind code, value]`` (float64) for a SUM or AVERAGE of ``x``."""
    try:
        check_value_op(op, x)
    except IdistError:
        return torch.tensor([_OTHER, 0.0], dtype=torch.float64)
    if type(x) is float:
        return torch.tensor([_FLOAT, x], dtype=torch.float64)
    if type(x) is int and -SMALL_INT < x < SMALL_INT:
        return torch.tensor([_INT, x], dtype=torch.float64)
    return torch.tensor([_OTHER, 0.0], dtype=torch.float64)


def result(summed: torch.Tensor, n: int, op: str) -> int | float | Miss:
    """The exact result from the summed pairs of ``n`` ranks, or ``MISS``."""
    code, value = (float(v) for v in summed.tolist())
    if code == n * _INT:  # ints only
        return int(value)
    if n == 2 and code == 2 * _FLOAT:  # two floats
        return value / 2 if op == "AVERAGE" else value
    return MISS


def gather_next_time(values: list[object]) -> bool:
    """After a gathered sum: whether the next one on this group should skip the pair."""
    return len(values) > 2 and all(type(v) is float for v in values)
