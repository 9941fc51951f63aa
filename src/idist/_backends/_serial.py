"""The serial backend: one process, every collective is the identity."""

from __future__ import annotations

from typing import Any, final

import attrs
import torch

from .._context import DistContext
from .._errors import CollectiveInputError


@attrs.define(eq=False)
class _SelfComm:
    """A group of one: byte collectives return their input."""

    ranks: tuple[int, ...] = (0,)
    group_rank: int = 0
    slot: int = 64
    sum_by_gather: bool = False

    def allgather_bytes(self, buf: torch.Tensor) -> torch.Tensor:
        return buf

    def broadcast_bytes(self, buf: torch.Tensor, src: int) -> None:
        return None


@final
@attrs.frozen(eq=False, kw_only=True)
class SerialContext(DistContext):
    """No distribution: rank 0 of 1. Collectives validate their input and return it."""

    MODEL_NAME = "serial"
    _comm_one: _SelfComm = attrs.field(factory=_SelfComm, repr=False, alias="_comm_one")

    def _world_comm(self) -> _SelfComm:
        return self._comm_one

    def _make_comm(self, ranks: tuple[int, ...]) -> _SelfComm:
        raise CollectiveInputError(f"serial context has only rank 0, not {list(ranks)}")

    def _allreduce_tensor(self, t: torch.Tensor, op: str, comm: Any) -> None:
        return None

    def _broadcast_tensor(self, t: torch.Tensor, src: int, comm: Any) -> None:
        return None

    def _barrier(self, comm: Any) -> None:
        return None


def default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def make() -> SerialContext:
    return SerialContext(
        backend="serial", rank=0, world_size=1, local_rank=0, nproc_per_node=1,
        node_rank=0, nnodes=1, device=default_device(),
    )  # fmt: skip


def create(name: str, **kwargs: Any) -> SerialContext:
    if kwargs:
        raise TypeError(f"the serial backend takes no options, got {sorted(kwargs)}")
    return make()


def is_available(name: str) -> bool:
    return True
