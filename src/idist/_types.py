"""Type aliases shared by the API: backend names, reduce ops, group arguments."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeAlias

NativeBackend: TypeAlias = Literal["gloo", "nccl", "mpi"]
HorovodBackend: TypeAlias = Literal["horovod"]
XlaBackend: TypeAlias = Literal["xla-tpu"]
SerialBackend: TypeAlias = Literal["serial"]
BackendName: TypeAlias = Literal["serial", "gloo", "nccl", "mpi", "horovod", "xla-tpu"]
ModelName: TypeAlias = Literal["serial", "native-dist", "horovod-dist", "xla-dist"]

#: The reduce ops every backend offers (emulated where the backend lacks one).
ReduceOp: TypeAlias = Literal["SUM", "PRODUCT", "MIN", "MAX", "AVERAGE", "AND", "OR"]
#: Horovod adds ADASUM; only ``HorovodContext.all_reduce`` accepts it.
HorovodReduceOp: TypeAlias = Literal["SUM", "PRODUCT", "MIN", "MAX", "AVERAGE", "AND", "OR", "ADASUM"]

COMMON_OPS: tuple[str, ...] = ("SUM", "PRODUCT", "MIN", "MAX", "AVERAGE", "AND", "OR")

#: ``group=`` takes a list of global ranks or a backend's own group object.
GroupArg: TypeAlias = "Sequence[int] | object | None"
