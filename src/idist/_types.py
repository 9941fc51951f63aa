"""Type aliases of the public API: backend names, model names, reduce ops, group arguments, and
the options ``initialize`` / ``context`` take for each backend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias, TypedDict

if TYPE_CHECKING:
    import datetime

    from torch._C._distributed_c10d import Store
    from torch.distributed import ProcessGroup

    from ._group import Group

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


class ProcessSetLike(Protocol):
    """A Horovod ``ProcessSet`` (described by shape, so the type needs no horovod)."""

    @property
    def process_set_id(self) -> int | None: ...
    @property
    def ranks(self) -> list[int] | None: ...


#: ``group=``: a list of global ranks, a ``Group`` from ``new_group``, or the backend's own
#: group (a torch ``ProcessGroup``, a Horovod ``ProcessSet``). A str is not a group.
GroupArg: TypeAlias = "Sequence[int] | Group | ProcessGroup | ProcessSetLike | None"


class NativeOptions(TypedDict, total=False):
    """What ``initialize`` / ``context`` take for gloo, nccl and mpi (torch.distributed).

    Without ``rank``, ``world_size`` and ``store`` the launcher's environment gives the
    topology; ``timeout`` is in seconds (or a ``timedelta``); ``checked`` turns on checked mode.
    """

    rank: int | None
    world_size: int | None
    init_method: str | None
    master_addr: str | None
    master_port: int | None
    store: Store | None
    timeout: float | datetime.timedelta | None
    checked: bool | None


class HorovodOptions(TypedDict, total=False):
    """What ``initialize`` / ``context`` take for Horovod: Horovod's gloo timeout, in seconds."""

    timeout: float | None


class XlaOptions(TypedDict, total=False):
    """What ``initialize`` / ``context`` take for XLA: how long a replica waits for its turn, in seconds."""

    timeout: float | None
