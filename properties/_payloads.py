"""Values that test how a collective carries what it is given.

Enums and flags travel without pickle and come back as their own type; ``Bomb`` pickles but
raises when unpickled (on every rank alike). Shared by the agreement properties and
tests/test_collectives_gloo.py; a module of its own so that rank processes import it by name.
"""

from __future__ import annotations

import enum
import os
from typing import Any


class Color(enum.IntEnum):
    RED = 1
    BLUE = 2


class Mode(enum.StrEnum):
    FAST = "fast"


class Perm(enum.IntFlag):
    R = 4
    W = 2


class Bomb:
    """Pickles fine; unpickling it raises."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_explode, ())


def _explode() -> None:
    raise RuntimeError("this payload refuses to unpickle")


class LoadsOnRankZero:
    """Pickles anywhere, unpickles only where ``RANK`` is 0 (a class the other ranks cannot import)."""

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return (_rank_zero_only, (42,))


def _rank_zero_only(value: int) -> int:
    if os.environ.get("RANK") != "0":
        raise RuntimeError("this rank cannot load the payload")
    return value
