"""Rank-side functions for the Horovod group tests (run by ``_worker.py`` under horovodrun)."""

from __future__ import annotations

from typing import Any

import torch

import idist


def process_sets_come_and_go(rounds: int) -> dict[str, Any]:
    """Add a process set, use it as ``group=``, remove it; each round the other rank is in it.

    Horovod gives a removed set's id to the next set, so a comm cached under the id would
    send round ``i + 1``'s calls through round ``i``'s removed set, on its old members.
    """
    import horovod.torch as hvd

    ctx = idist.initialize()
    rank = ctx.rank
    seen: list[tuple[int | None, list[float], list[int], list[float]]] = []
    try:
        for i in range(rounds):
            ps = hvd.add_process_set([i % 2])
            reduced = ctx.all_reduce(torch.tensor([rank + 10.0 * i]), group=ps).tolist()
            gathered = ctx.all_gather(rank, group=ps)
            bcast = ctx.broadcast(torch.tensor([rank + 0.5]), src=i % 2, group=ps).tolist()
            seen.append((ps.process_set_id, reduced, gathered, bcast))
            assert hvd.remove_process_set(ps)
        world = ctx.all_reduce(rank + 1)  # every rank is still in step
    finally:
        idist.finalize()
    return {"rounds": seen, "world": world}
