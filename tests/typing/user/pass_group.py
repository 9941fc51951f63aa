"""#35 item 7, accepted: the group forms the runtime takes."""

from __future__ import annotations

from collections import deque
from typing import reveal_type

import idist


def groups(ctx: idist.DistContext, ranks: deque[int]) -> None:
    reveal_type(ctx.all_reduce(1, group=[0, 1]))  # revealed: int
    ctx.barrier(group=(0, 1))
    ctx.barrier(group=range(ctx.world_size))
    ctx.barrier(group=list(ranks))
    ctx.barrier(group=ctx.new_group(ranks))  # new_group takes any sequence of ranks
