"""Type aliases of the public API: backend names, model names, reduce ops, group arguments, and
the options ``initialize`` / ``context`` take for each backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias, TypedDict, TypeVar

if TYPE_CHECKING:
    import datetime

    from torch._C._distributed_c10d import Store
    from torch.distributed import ProcessGroup

    from ._group import Group
    from .launch._plan import StartMethod

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
#: The ops ``all_reduce`` takes for a Python ``float``, ``int`` and ``bool`` (``_reduce``'s tables).
FloatReduceOp: TypeAlias = Literal["SUM", "PRODUCT", "MIN", "MAX", "AVERAGE"]
IntReduceOp: TypeAlias = Literal["SUM", "PRODUCT", "MIN", "MAX", "AND", "OR"]
BoolReduceOp: TypeAlias = Literal["AND", "OR", "MIN", "MAX"]
#: what a bool is refused: a bool is an int to a type checker, so an overload marked deprecated flags
#: these (an error in pyright strict, and in mypy with the ``deprecated`` error code on)
BoolRefusedOp: TypeAlias = Literal["SUM", "PRODUCT", "AVERAGE"]
#: ``broadcast``'s receiver that passes None: a TypeVar bound to None rather than plain None, because
#: mypy's overload rule for a plain None beside a TypeVar makes ``X | None`` come back as ``X | Any``
NoneT = TypeVar("NoneT", bound="None")


class FloatValue(Protocol):
    """A Python ``float`` and not an ``int``: ``all_reduce``'s float overload takes this, because a type
    checker lets an ``int`` pass for ``float``, and ``AVERAGE`` of ints is refused (``hex`` is float's own)."""

    def hex(self) -> str: ...


COMMON_OPS: tuple[str, ...] = ("SUM", "PRODUCT", "MIN", "MAX", "AVERAGE", "AND", "OR")


class ProcessSetLike(Protocol):
    """A Horovod ``ProcessSet`` (described by shape, so the type needs no horovod)."""

    @property
    def process_set_id(self) -> int | None: ...
    @property
    def ranks(self) -> list[int] | None: ...


#: ``group=``: a list, tuple or range of global ranks, a ``Group`` from ``new_group``, or the backend's
#: own group (a torch ``ProcessGroup``, a Horovod ``ProcessSet``). Other sequences (a str, bytes, a
#: deque) are refused when the call runs, so they are not in the type either.
GroupArg: TypeAlias = "list[int] | tuple[int, ...] | range | Group | ProcessGroup | ProcessSetLike | None"


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
    #: seconds of silence after which a peer is lost (default ``IDIST_LIVENESS``, else 30; 0: off)
    liveness: float | None


class HorovodOptions(TypedDict, total=False):
    """What ``initialize`` / ``context`` take for Horovod: Horovod's gloo timeout, in seconds."""

    timeout: float | None


class XlaOptions(TypedDict, total=False):
    """What ``initialize`` / ``context`` take for XLA: how long a replica waits for its turn, in seconds."""

    timeout: float | None


#: the torch.distributed backends ``spawn`` starts itself (mpi is started by mpirun)
SpawnedNative: TypeAlias = Literal["gloo", "nccl"]


class _Endpoint(TypedDict, total=False):
    node_rank: int
    master_addr: str | None
    master_port: int | None


class NodeOptions(_Endpoint, total=False):
    """``spawn(fn, ...)``'s keyword-only options: this launch as one node of a larger world."""

    nnodes: int


class ElasticNodeOptions(_Endpoint, total=False):
    """``NodeOptions`` of a joined ``spawn(fn, ...)``: ``max_restarts`` or ``nnodes=(MIN, MAX)`` run it on
    torch's elastic agent (docs/elastic.md)."""

    nnodes: int | tuple[int, int]
    max_restarts: int


class SpawnOptions(TypedDict, total=False):
    """``spawn(backend, fn, ...)``'s keyword-only options: how the ranks start, ``timeout`` for their context."""

    daemon: bool
    start_method: StartMethod
    timeout: float | None


class ElasticSpawnOptions(SpawnOptions, total=False):
    """``SpawnOptions`` of a joined ``spawn(backend, fn, ...)``, with the restarts of an elastic launch."""

    max_restarts: int


class DrivenOptions(TypedDict, total=False):
    """As ``SpawnOptions``, for horovod.run and torch_xla.launch: their processes start their own, so
    they are never daemons."""

    daemon: Literal[False]
    start_method: StartMethod
    timeout: float | None
