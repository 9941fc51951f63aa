"""``XlaComm``: byte collectives for one group, run by every replica of the world.

An XLA collective is one program that all replicas execute, so a rank outside the group
takes part too, as a *bystander* (``group_rank == -1``): its own singleton replica group,
or a zero contribution; it discards what it gets.
"""

from __future__ import annotations

import attrs
import torch

from ..._exchange import LockStep
from . import _lib
from ._device import XlaDevice


@attrs.define(eq=False)
class XlaComm:
    """Byte and tensor collectives for one group, run by every replica of the world."""

    device: XlaDevice = attrs.field(repr=False)
    ranks: tuple[int, ...]
    group_rank: int
    #: xm replica groups: None for the world, else the group plus every other rank alone
    replica_groups: list[list[int]] | None
    lockstep: LockStep = attrs.Factory(LockStep)
    scratch: dict[str, torch.Tensor] = attrs.Factory(dict)

    @property
    def confirms(self) -> bool:
        """No round confirms a pickle (``_exchange.confirmed``): bystanders gather without decoding."""
        return False

    @property
    def bystander(self) -> bool:
        return self.group_rank < 0

    def allgather_bytes(self, buf: torch.Tensor) -> torch.Tensor:
        n = buf.numel()
        dev = self.device.prepare(buf)
        out = self.device.materialize([_lib.xm.all_gather(dev, pin_layout=False)])[0]
        if self.replica_groups is None:
            return out
        return torch.cat([out[r * n : (r + 1) * n] for r in self.ranks])

    def broadcast_bytes(self, buf: torch.Tensor, src: int) -> None:
        # World-wide SUM: bystanders receive src's bytes too, so they take the same rounds.
        mine = buf if self.group_rank == src else torch.zeros_like(buf)
        buf.copy_(self.device.world_sum([mine])[0])


def make_comm(device: XlaDevice, ranks: tuple[int, ...]) -> XlaComm:
    """The comm of ``ranks`` as seen from ``device``'s replica (a bystander outside them)."""
    grank = ranks.index(device.rank) if device.rank in ranks else -1
    groups = (
        None
        if len(ranks) == device.world_size
        else [list(ranks)] + [[r] for r in range(device.world_size) if r not in ranks]
    )
    return XlaComm(device, ranks, grank, groups)
