"""The torch ProcessGroup surface idist calls: ``PGLike``, the option objects, ``BrokenPG``."""

from __future__ import annotations

import datetime
import functools
from typing import Protocol

import attrs
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    Work,
)

from ..._errors import GroupBrokenError

TORCH_OPS = {
    "SUM": dist.ReduceOp.SUM,
    "PRODUCT": dist.ReduceOp.PRODUCT,
    "MIN": dist.ReduceOp.MIN,
    "MAX": dist.ReduceOp.MAX,
    "AND": dist.ReduceOp.BAND,
    "OR": dist.ReduceOp.BOR,
    "AVERAGE": dist.ReduceOp.AVG,
}


class PGLike(Protocol):
    """The methods idist calls on a torch ProcessGroup or a backend (ProcessGroupGloo...)."""

    def allreduce(self, tensors: list[torch.Tensor], opts: AllreduceOptions, /) -> Work: ...
    def allgather(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: AllgatherOptions = ...,
        /,
    ) -> Work: ...
    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: AllgatherOptions = ..., /) -> Work: ...
    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: AllToAllOptions = ...,
        /,
    ) -> Work: ...
    def broadcast(self, tensors: list[torch.Tensor], opts: BroadcastOptions, /) -> Work: ...
    def barrier(self, opts: BarrierOptions = ..., /) -> Work: ...


@functools.lru_cache(maxsize=64)  # a few (op, section timeout) pairs; checked mode uses one per call
def reduce_options(op: str, timeout: datetime.timedelta | None = None) -> AllreduceOptions:
    opts = AllreduceOptions()
    opts.reduceOp = TORCH_OPS[op]  # type: ignore[assignment]  # torch's stub types it as its enum class
    if timeout is not None:
        opts.timeout = timeout
    return opts


REDUCE_OPTIONS = {op: reduce_options(op) for op in TORCH_OPS}


@functools.lru_cache(maxsize=16)
def gather_options(timeout: datetime.timedelta | None = None) -> AllgatherOptions:
    opts = AllgatherOptions()
    if timeout is not None:
        opts.timeout = timeout
    return opts


GATHER = gather_options()


@functools.lru_cache(maxsize=16)
def alltoall_options(timeout: datetime.timedelta | None = None) -> AllToAllOptions:
    opts = AllToAllOptions()
    if timeout is not None:
        opts.timeout = timeout
    return opts


ALLTOALL = alltoall_options()


@attrs.frozen
class BrokenPG:
    """What a broken group's comms hold instead of their process group: every call raises why."""

    reason: str

    def _raise(self, *args: object) -> Work:
        raise GroupBrokenError(f"the group is broken ({self.reason}); finalize this context and create a new one")

    allreduce = allgather = _allgather_base = alltoall_base = broadcast = barrier = _raise
