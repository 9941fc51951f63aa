"""#35 item 4: an int where a float is declared is a float to the type checker, and to all_reduce."""

from __future__ import annotations

from typing import reveal_type

import idist


def mean_loss(ctx: idist.DistContext) -> float:
    loss: float = 0 if ctx.rank == 0 else 1.5
    total = ctx.all_reduce(loss)
    reveal_type(total)  # revealed: float
    return total / ctx.world_size


def local_loss(rank: int) -> float:
    return 1 if rank == 0 else 0  # an int, declared a float


def average_of_ints(ctx: idist.DistContext) -> float:
    mean = ctx.all_reduce(local_loss(ctx.rank), "AVERAGE")
    reveal_type(mean)  # revealed: float
    return mean
