"""SUM / AVERAGE of Python numbers in one small float64 all_reduce, when that is exact.

A group starts in mode ``"pair"``: each rank contributes ``[kind code, value]``. The summed
codes tell every rank how many ranks passed which kind (a sum no codes make: some rank made
another call, ``FOREIGN``); small ints sum exactly in any order, and two numbers on two
ranks sum to the rank-order fold. Once every rank passed small ints (or, on two ranks,
floats), the group sends one element: the value, or NaN from a rank of another kind (every
rank sees the miss). Whenever the result cannot be exact (other kinds, big ints, floats on 3+
ranks, a NaN whose bits the fold must choose) every rank sees it from the same sum and
gathers every value to fold in rank order. The next mode follows from what every rank saw.
See docs/design.md, "Python numbers".
"""

from __future__ import annotations

import math
from typing import Literal

import torch

#: the pair path is used for groups of 2 .. MAX_RANKS - 1 ranks
MAX_RANKS = 1 << 13
#: ints strictly inside ±SMALL_INT take the fast paths
SMALL_INT = 1 << 40
#: kind codes are multiples of an odd-looking base: their sums are exact (below 2**48 times
#: 2**-30), and a value that is no sum of codes (a peer's tensor data) almost never decodes
_BASE = 469 * 2.0**-30
_INT, _FLOAT, _OTHER = _BASE, _BASE * MAX_RANKS, _BASE * MAX_RANKS**2
OPS = ("SUM", "AVERAGE")

#: how a group's next SUM of Python numbers moves (the same on every rank of the group)
Mode = Literal["pair", "int", "float", "gather"]


class Miss:
    """The all_reduce could not give the exact result: gather."""


class Foreign:
    """The sum is one no Python numbers make: some rank made another call (a tensor all_reduce)."""


MISS = Miss()
FOREIGN = Foreign()


def _small_int(x: object) -> bool:
    return type(x) is int and -SMALL_INT < x < SMALL_INT


def contribution(x: object, mode: Mode) -> torch.Tensor:
    """This rank's float64 tensor to SUM for ``x`` in ``mode`` ("pair", "int" or "float")."""
    if mode == "pair":
        if type(x) is float:
            return torch.tensor([_FLOAT, x], dtype=torch.float64)
        if _small_int(x):
            return torch.tensor([_INT, x], dtype=torch.float64)
        return torch.tensor([_OTHER, 0.0], dtype=torch.float64)
    fits = _small_int(x) if mode == "int" else type(x) is float
    return torch.tensor(x if fits else math.nan, dtype=torch.float64)


def _counts(code: float, n: int) -> tuple[int, int, int] | None:
    """How many ranks sent an int, a float, anything else; None when ``code`` is no sum of ``n`` codes."""
    k = code / _BASE
    if not (math.isfinite(k) and k.is_integer()):
        return None
    others, rest = divmod(int(k), MAX_RANKS**2)
    floats, ints = divmod(rest, MAX_RANKS)
    return (ints, floats, others) if ints + floats + others == n else None


def result(summed: torch.Tensor, n: int, op: str, mode: Mode) -> tuple[int | float | Miss | Foreign, Mode]:
    """The exact result from the sum over ``n`` ranks in ``mode`` (or ``MISS``, ``FOREIGN``), and the
    group's next mode (the same on every rank: it follows from the sum)."""
    if mode == "pair":
        code, value = (float(v) for v in summed.tolist())
        counts = _counts(code, n)
        if counts is None:
            return FOREIGN, mode
        _, floats, others = counts
        if others or math.isnan(value) or (floats and n > 2):
            return MISS, mode
        if not floats:  # ints only (an AVERAGE of them is a float: the exact sum, divided once)
            return (int(value) / n if op == "AVERAGE" else int(value)), "int"
        return (value / 2 if op == "AVERAGE" else value), "float" if floats == 2 else "pair"
    value = float(summed.item())
    if math.isnan(value):
        return MISS, mode
    if mode == "float":
        return (value / 2 if op == "AVERAGE" else value), mode
    if not (value.is_integer() and abs(value) < n * SMALL_INT):
        return FOREIGN, mode
    return (int(value) / n if op == "AVERAGE" else int(value)), mode


def after_gather(values: list[object]) -> Mode:
    """The mode after a gathered sum, from the values every rank saw."""
    if all(_small_int(v) for v in values):
        return "int"
    if all(type(v) is float for v in values):
        return "float" if len(values) == 2 else "gather"
    return "pair"
