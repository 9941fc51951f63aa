"""Where a rank sits in its job: the one topology record every layer shares."""

from __future__ import annotations

from typing import final

import attrs


@final
@attrs.frozen(kw_only=True)
class Topology:
    """Rank ``rank`` of ``world_size``; local rank ``local_rank`` of the ``nproc_per_node``
    processes on node ``node_rank`` of ``nnodes``. Fixed at creation; never communicates."""

    rank: int
    world_size: int
    local_rank: int
    nproc_per_node: int
    node_rank: int
    nnodes: int

    def lines(self) -> list[str]:
        """The topology as ignite's ``show_config`` words it, one line per field."""
        return [
            f"world size: {self.world_size}",
            f"rank: {self.rank}",
            f"local rank: {self.local_rank}",
            f"num processes per_node: {self.nproc_per_node}",
            f"num nodes: {self.nnodes}",
            f"node rank: {self.node_rank}",
        ]

    @classmethod
    def single(cls) -> Topology:
        """One process: rank 0 of 1 on one node."""
        return cls(rank=0, world_size=1, local_rank=0, nproc_per_node=1, node_rank=0, nnodes=1)

    @classmethod
    def flat(cls, rank: int, world_size: int) -> Topology:
        """``world_size`` processes on one node (local rank = rank)."""
        return cls(rank=rank, world_size=world_size, local_rank=rank, nproc_per_node=world_size, node_rank=0, nnodes=1)
