"""``DistContext``: the API every context offers, written once over the backend hooks.

Queries never communicate; the collectives check their arguments here and move data in
``_collectives``; rank-only helpers delegate to ``_rank_only``. The training and checkpoint
methods are in ``_training_api``, the fields and the hooks a backend implements in ``_core``.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

import attrs
import torch
from typing_extensions import deprecated

from . import _collectives, _rank_only
from ._core import CommT_co
from ._group import Group, check_ranks
from ._log import visible_logger
from ._training_api import TrainingMethods
from ._types import (
    BoolReduceOp,
    BoolRefusedOp,
    FloatReduceOp,
    FloatValue,
    GroupArg,
    HorovodReduceOp,
    IntReduceOp,
    ModelName,
    NoneT,
    ReduceOp,
)

if TYPE_CHECKING:
    from ._backends.horovod._comm import HorovodComm

__all__ = ["DistContext"]

T = TypeVar("T")
TensorT = TypeVar("TensorT", bound=torch.Tensor)
P = ParamSpec("P")
R = TypeVar("R")


@attrs.frozen(eq=False, kw_only=True)
class DistContext(TrainingMethods[CommT_co]):
    """A distributed configuration, fixed at creation.

    Use the module functions (``idist.all_reduce``...) or this object's methods; both
    have the same semantics. Create one with ``idist.initialize`` or ``idist.context``,
    never by hand; it cannot be copied (``attrs.evolve`` raises ``TypeError``).
    """

    # ------------------------------------------------------------------ queries
    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def world_size(self) -> int:
        return self.topology.world_size

    @property
    def local_rank(self) -> int:
        return self.topology.local_rank

    @property
    def nproc_per_node(self) -> int:
        return self.topology.nproc_per_node

    @property
    def node_rank(self) -> int:
        return self.topology.node_rank

    @property
    def nnodes(self) -> int:
        return self.topology.nnodes

    def get_rank(self) -> int:
        return self.topology.rank

    def get_world_size(self) -> int:
        return self.topology.world_size

    def get_local_rank(self) -> int:
        return self.topology.local_rank

    def get_node_rank(self) -> int:
        return self.topology.node_rank

    def get_nnodes(self) -> int:
        return self.topology.nnodes

    def get_nproc_per_node(self) -> int:
        return self.topology.nproc_per_node

    def model_name(self) -> ModelName:
        return self.MODEL_NAME

    def hostname(self) -> str:
        return socket.gethostname()

    @property
    def checked(self) -> bool:
        """Whether collectives are compared across ranks before they move data (checked mode)."""
        return False

    def show_config(self) -> None:
        """Log the configuration (and what decided it) at INFO on the ``idist.config`` logger.

        With no logging configured, rank 0 prints it to stderr (as ignite does); with
        logging configured, the record goes to the application's handlers once.
        """
        lines = [
            f"distributed configuration: {self.MODEL_NAME} ({type(self).__name__})",
            f"backend: {self.backend}",
            f"device: {self.device}",
            f"hostname: {self.hostname()}",
            *self.topology.lines(),
            *(f"decided by: {k}: {v}" for k, v in self.config.items()),
        ]
        visible_logger("idist.config").info("\n".join(lines), extra={"idist_rank": self.rank})

    # ------------------------------------------------------------------ groups
    def new_group(self, ranks: Sequence[int]) -> Group:
        """A group of the given global ranks, usable as ``group=`` in any collective."""
        key = check_ranks(ranks, self.world_size)
        self._comm_for(key)
        return Group(key, key.index(self.rank) if self.rank in key else -1)

    # ------------------------------------------------------------- collectives
    # One overload per value type, with the ops the runtime takes for it (``_reduce``'s tables);
    # Horovod's contexts also take ADASUM for tensors.
    @overload
    def all_reduce(self, tensor: TensorT, op: ReduceOp = "SUM", group: GroupArg = None) -> TensorT: ...
    @overload
    def all_reduce(
        self: DistContext[HorovodComm], tensor: TensorT, op: HorovodReduceOp, group: GroupArg = None
    ) -> TensorT: ...
    @overload
    def all_reduce(self, tensor: bool, op: BoolReduceOp, group: GroupArg = None) -> bool: ...
    @overload
    @deprecated(
        "all_reduce of a bool takes op AND, OR, MIN or MAX (SUM, PRODUCT and AVERAGE raise "
        "UnsupportedOpError); to count the True values, reduce int(flag)"
    )
    def all_reduce(self, tensor: bool, op: BoolRefusedOp = "SUM", group: GroupArg = None) -> bool: ...
    @overload
    def all_reduce(self, tensor: int, op: IntReduceOp = "SUM", group: GroupArg = None) -> int: ...
    @overload
    def all_reduce(self, tensor: FloatValue, op: FloatReduceOp = "SUM", group: GroupArg = None) -> float: ...
    def all_reduce(self, tensor: object, op: HorovodReduceOp = "SUM", group: GroupArg = None) -> object:
        """Reduce ``tensor`` (a tensor or a Python number) over the group (all ranks by default).

        Tensors are reduced in place and returned; Python ``int``/``float``/``bool`` give a
        new value of the same type, exact in int64/float64. Ranks outside ``group`` get
        ``tensor`` back unchanged. Raises ``UnsupportedOpError`` for an op this backend or data
        type cannot do (before communicating), ``ReduceOverflowError`` when an int result
        leaves int64, ``UnsupportedValueError`` for other types. A ``HorovodContext`` also takes
        ``op="ADASUM"`` for floating-point tensors.
        """
        return self._all_reduce(tensor, op, group)

    def _all_reduce(self, x: object, op: str, group: GroupArg) -> object:
        comm, error = self._enter(group)
        if comm is None or comm.group_rank < 0:  # nobody waits for this rank, unless it is a bystander
            return self._outside(comm, "all_reduce", x, _collectives.checked_op(self, False, x, op, error)[1])
        name, error = _collectives.checked_op(self, True, x, op, error)
        self._checkpoint(comm, "all_reduce", op=name, src="", value=x, error=error)
        return _collectives.all_reduce(self, comm, x, name)

    @overload
    def all_gather(self, tensor: torch.Tensor, group: GroupArg = None) -> list[torch.Tensor]: ...
    @overload
    def all_gather(self, tensor: T, group: GroupArg = None) -> list[T]: ...
    def all_gather(self, tensor: T, group: GroupArg = None) -> list[T]:
        """One entry per rank of the group, in rank order.

        Tensors may differ in shape between ranks (any dimension) but not in dtype.
        int/float/bool/str/bytes/Path round-trip exactly without pickle; other objects go
        through pickle (peers are trusted). A rank outside ``group`` gets ``[tensor]``.
        """
        return self._all_gather(tensor, group)

    def _all_gather(self, x: T, group: GroupArg, shapes: object = None) -> list[T]:
        comm, error = self._enter(group)
        if comm is None or comm.group_rank < 0:
            return [self._outside(comm, "all_gather", x, None)]
        self._checkpoint(comm, "all_gather", op="", src="", value=x, error=error)
        # a rank's own declared shape is checked inside the gather, so every rank raises alike
        declared = None if shapes is None else _collectives.declared_shape(shapes, comm.group_rank, len(comm.ranks))
        return _collectives.all_gather(comm, x, declared)

    # What a rank gets: src's value, of the type every rank passes (so ``X | None`` when src may pass
    # None, and for a rank outside ``group``, which gets its own input back); a tensor placeholder
    # that does not fit (a Parameter among them) gives way to a new plain Tensor.
    @overload
    def broadcast(self, tensor: NoneT, src: int = 0, group: GroupArg = None, *, safe_mode: bool = False) -> Any: ...  # pyright: ignore[reportInvalidTypeVarUse]
    @overload
    def broadcast(
        self, tensor: torch.Tensor, src: int = 0, group: GroupArg = None, *, safe_mode: bool = False
    ) -> torch.Tensor: ...
    @overload
    def broadcast(
        self, tensor: torch.Tensor | None, src: int = 0, group: GroupArg = None, *, safe_mode: bool = False
    ) -> torch.Tensor | None: ...
    @overload
    def broadcast(self, tensor: T, src: int = 0, group: GroupArg = None, *, safe_mode: bool = False) -> T: ...
    def broadcast(self, tensor: object, src: int = 0, group: GroupArg = None, *, safe_mode: bool = False) -> object:
        """Every rank returns ``src``'s value (``src`` is a global rank).

        Tensors land in place when the receiver passes one of the same shape and dtype;
        otherwise (or for ``None``) the receiver gets a new tensor on its device. Python
        values are exact. ``safe_mode`` is accepted for ignite code: receivers may always
        pass ``None``. Ranks outside ``group`` get ``tensor`` back unchanged.
        """
        del safe_mode
        return self._broadcast(tensor, src, group)

    def _broadcast(self, x: object, src: int, group: GroupArg) -> object:
        comm, error = self._enter(group)
        if comm is None or comm.group_rank < 0:  # nobody waits for this rank, unless it is a bystander
            return self._outside(comm, "broadcast", x, error or _collectives.src_error(src, self.world_size, None), src)
        error = error or _collectives.src_error(src, self.world_size, comm.ranks)
        self._checkpoint(comm, "broadcast", op="", src=str(src), value=None, error=error)
        return _collectives.broadcast(self, comm, x, src)

    def all_gather_tensors_with_shapes(
        self, tensor: torch.Tensor, shapes: Sequence[Sequence[int]], group: GroupArg = None
    ) -> list[torch.Tensor]:
        """ignite's ragged gather: one tensor per rank of the group, rank ``i``'s of shape ``shapes[i]``.

        ``all_gather`` already moves tensors of different shapes; this also checks each rank's
        tensor against the shape it declared for itself, inside the gather
        (``CollectiveInputError`` on every rank, naming it). A rank outside ``group`` gets ``[tensor]``.
        """
        return self._all_gather(tensor, group, shapes)

    def barrier(self, group: GroupArg = None) -> None:
        """Return only when every rank of the group has arrived."""
        comm, error = self._enter(group)
        if comm is not None:
            self._checkpoint(comm, "barrier", op="", src="", value=None, error=error)
            self._barrier(comm)

    def sync(self, group: GroupArg = None) -> None:
        """Wait for this rank's pending device work, then barrier."""
        self._check_open()
        self._sync_device()
        self.barrier(group)

    def timeout(self, seconds: float) -> AbstractContextManager[None]:
        """``with ctx.timeout(s):`` bounds each collective in the block to ``s`` seconds.

        The process group's own timeout is unchanged. A collective that runs past it raises
        ``CollectiveTimeoutError`` naming the ranks that did not arrive; the group is then
        broken and must be finalized. Serial contexts never wait, so it has no effect there.
        """
        if not seconds > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {seconds!r}")
        return nullcontext()

    def any_rank_failed(self, failed: bool, group: GroupArg = None) -> bool:
        """True on every rank when ``failed`` is true on any rank: consensus for user code."""
        return self.all_reduce(bool(failed), "OR", group)

    # -------------------------------------------------------- rank-only helpers
    def one_rank_only(
        self, rank: int = 0, with_barrier: bool = True
    ) -> Callable[[Callable[P, R]], Callable[P, R | None]]:
        """Decorator: run the function on ``rank`` only (the others get None), then barrier."""
        return _rank_only.one_rank_only(lambda: self, rank, with_barrier)

    def one_rank_first(self, rank: int = 0, local: bool = False) -> AbstractContextManager[None]:
        """Context manager: ``rank`` runs the block first, the others after it finished."""
        return _rank_only.one_rank_first(lambda: self, rank, local)
