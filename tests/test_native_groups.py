"""torch's own process groups as ``group=``: each group has its own comm, found by the group itself.

A comm used to be cached under the group's ``id()``, which a later group can reuse once the
first one is garbage-collected, and named in the rendezvous store by that ``id()``, which
differs between ranks. Real gloo processes: ``dist.new_group`` needs torch's default group.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

import idist
from multiproc import run_ranks

pytestmark = pytest.mark.timeout(300)

#: the members of round i's group, in a world of 3: every rank is in and out in turn
MEMBERS = [(0, 1), (1, 2), (0, 2)]


def _groups_made_and_dropped(rank: int, rounds: int) -> dict[str, Any]:
    import torch.distributed as dist

    ctx = idist.initialize("gloo", timeout=60)
    try:
        results, ids, cached = [], set(), []
        for i in range(rounds):
            members = MEMBERS[i % len(MEMBERS)]
            g = dist.new_group(list(members))  # every rank calls it; a non-member gets a placeholder
            if rank in members:
                ids.add(id(g))
                reduced = idist.all_reduce(torch.tensor([rank + 1, i]), group=g).tolist()
                results.append((i, reduced, idist.all_gather(rank, group=g)))
                dist.destroy_process_group(g)
            del g
            gc.collect()
            cached.append(len(ctx._state.group_comms))
        return {"results": results, "distinct_ids": len(ids), "cached": max(cached)}
    finally:
        idist.finalize()


def test_groups_made_and_dropped_in_a_loop_never_get_a_stale_comm() -> None:
    rounds = 12
    for rank, out in enumerate(run_ranks(_groups_made_and_dropped, 3, rounds, timeout=240)):
        mine = [i for i in range(rounds) if rank in MEMBERS[i % len(MEMBERS)]]
        expected = [(i, [sum(m + 1 for m in MEMBERS[i % 3]), 2 * i], list(MEMBERS[i % 3])) for i in mine]
        assert out["results"] == expected, rank
        # a comm goes with its group: nothing piles up, whatever ids the next groups get
        assert out["cached"] == 0, rank


def _same_local_failure_on_a_torch_group(rank: int) -> tuple[str, list[int], str | None]:
    import torch.distributed as dist

    ctx = idist.initialize("gloo", timeout=60)
    try:
        g = dist.new_group([0, 1])
        try:
            idist.all_reduce(torch.zeros(2), "AND", group=g)  # refused on every rank before moving data
            failed = "returned"
        except idist.IdistError as exc:
            failed = type(exc).__name__
        after = idist.all_reduce(torch.tensor([rank + 1]), group=g).tolist()
        return failed, after, ctx._broken()
    finally:
        idist.finalize()


def test_ranks_that_fail_alike_on_a_torch_group_agree_and_keep_it() -> None:
    # the ranks agree through the store under the group's name, which is the same on every rank
    assert run_ranks(_same_local_failure_on_a_torch_group, 2, timeout=120) == [("UnsupportedOpError", [3], None)] * 2
