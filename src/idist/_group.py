"""Subgroups: the ``Group`` that ``new_group`` returns, and the check of a list of ranks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import final

import attrs

from ._errors import CollectiveInputError


@final
@attrs.frozen(eq=False)
class Group:
    """A subgroup of a context's ranks, as returned by ``new_group``; pass it as ``group=``."""

    #: the members' global ranks, sorted
    ranks: tuple[int, ...]
    #: the rank that made it, within the group (-1: not a member)
    group_rank: int = -1

    def rank(self) -> int:
        """This process's rank within the group, or -1 when it is not a member (torch's convention)."""
        return self.group_rank

    def size(self) -> int:
        """How many ranks the group has."""
        return len(self.ranks)


def check_ranks(ranks: object, world_size: int) -> tuple[int, ...]:
    """``ranks`` as a sorted tuple of distinct global ranks, or ``CollectiveInputError``."""
    members: list[object] = list(ranks) if isinstance(ranks, Iterable) else [None]
    ints = [r for r in members if isinstance(r, int) and not isinstance(r, bool)]
    if len(ints) != len(members):
        # ranks like "a", 1.7 or True are refused, never coerced
        raise CollectiveInputError(
            f"group must be a list of global ranks (ints) or a group from new_group(), got {ranks!r}"
        )
    if len(set(ints)) != len(ints):
        raise CollectiveInputError(f"group ranks {ints} repeat a rank; list each rank once")
    key = tuple(sorted(ints))
    if not key or key[0] < 0 or key[-1] >= world_size:
        raise CollectiveInputError(f"group ranks {list(key)} must be non-empty and within 0..{world_size - 1}")
    return key
