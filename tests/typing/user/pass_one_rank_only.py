"""#35 item 1, accepted: the result of a ``one_rank_only`` function is checked for None."""

from __future__ import annotations

from typing import reveal_type

import idist


@idist.one_rank_only()
def compute(x: int) -> int:
    return x + 40


def answer(ctx: idist.DistContext) -> int | None:
    got = compute(1)
    reveal_type(got)  # revealed: int | None
    return None if got is None else got + 1
