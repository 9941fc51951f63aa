"""#35 item 1: ``@one_rank_only()`` returns None on the other ranks, so its result is ``R | None``."""

from __future__ import annotations

import idist


@idist.one_rank_only()
def compute() -> int:
    return 41


def answer(ctx: idist.DistContext) -> int:
    # rejected: mypy[operator] pyright[reportOptionalOperand,reportUnknownVariableType]
    return compute() + 1


def answer_on(ctx: idist.DistContext) -> int:
    @ctx.one_rank_only(rank=1)
    def local() -> int:
        return 41

    # rejected: mypy[operator] pyright[reportOptionalOperand,reportUnknownVariableType]
    return local() + 1
