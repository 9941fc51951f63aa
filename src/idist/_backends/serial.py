"""The serial backend: one process, every collective is the identity."""

from __future__ import annotations

from typing import Any, Self, final

import attrs
import torch
from torch import nn

from .._context import DistContext
from .._core import ContextState
from .._errors import CollectiveInputError
from .._exchange import LockStep
from .._topology import Topology
from ..training._model import whole


@attrs.define(eq=False)
class SelfComm:
    """A group of one: byte collectives return their input."""

    ranks: tuple[int, ...] = (0,)
    group_rank: int = 0
    lockstep: LockStep = attrs.Factory(LockStep)
    scratch: dict[str, torch.Tensor] = attrs.Factory(dict)

    @property
    def confirms(self) -> bool:
        """No round confirms a pickle (``_exchange.confirmed``): a group of one loads it or raises."""
        return False

    def allgather_bytes(self, buf: torch.Tensor) -> torch.Tensor:
        return buf

    def broadcast_bytes(self, buf: torch.Tensor, src: int) -> None:
        return None


def default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


@final
@attrs.frozen(eq=False, kw_only=True)
class SerialContext(DistContext[SelfComm]):
    """No distribution: rank 0 of 1. Collectives validate their input and return it."""

    MODEL_NAME = "serial"

    @classmethod
    def create(cls, name: str = "serial", /, **options: Any) -> Self:
        if options:
            raise TypeError(f"the serial backend takes no options, got {sorted(options)}")
        return cls(
            backend="serial", topology=Topology.single(), device=default_device(), _state=ContextState(SelfComm())
        )

    @classmethod
    def is_available(cls, name: str) -> bool:
        return True

    def _make_comm(self, ranks: tuple[int, ...]) -> SelfComm:
        raise CollectiveInputError(f"serial context has only rank 0, not {list(ranks)}")

    def _allreduce_tensor(self, t: torch.Tensor, op: str, comm: SelfComm) -> None:
        return None

    def _broadcast_tensor(self, t: torch.Tensor, src: int, comm: SelfComm) -> None:
        return None

    def _barrier(self, comm: SelfComm) -> None:
        return None

    def _shard_model(self, model: nn.Module, sync_bn: bool, kwargs: dict[str, Any]) -> nn.Module:
        return whole(self, model, kwargs)
