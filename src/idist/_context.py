"""``DistContext``: the immutable context every backend class derives from.

Topology is fixed at creation, so a query never communicates. The collectives are written
once here on top of a handful of per-backend primitives (``_comm``, ``_allreduce_tensor``,
``_broadcast_tensor``, ``_barrier``); a backend class holds only what differs.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, overload

import attrs
import torch

from . import _codec, _exchange, _number_sum
from ._errors import (
    CollectiveInputError,
    ContextClosedError,
    IdistError,
)
from ._guard import Guard, fingerprint
from ._reduce import check_op_name, check_tensor_op, check_value_op, fold_values
from ._types import COMMON_OPS, GroupArg, ReduceOp

if TYPE_CHECKING:
    from torch import nn
    from torch.optim import Optimizer
    from torch.utils.data import DataLoader, Dataset

    from ._exchange import Comm
    from .training import AutoDataLoader

T = TypeVar("T")
TensorT = TypeVar("TensorT", bound=torch.Tensor)
OptimizerT = TypeVar("OptimizerT", bound="Optimizer")
F = TypeVar("F", bound=Callable[..., Any])

logger = logging.getLogger("idist")

#: Tensors up to this many bytes ride inside the broadcast frame (one collective);
#: larger ones are broadcast straight into the receiver's tensor after a header round.
INLINE_TENSOR_BYTES = 1 << 16
_NO_VALUE = object()


@attrs.frozen(eq=False)
class Group:
    """A subgroup of a context's ranks, as returned by ``new_group``."""

    ranks: tuple[int, ...]
    handle: object = attrs.field(repr=False, default=None)


@attrs.define(eq=False)
class _State:
    """The only mutable part of a context: lifecycle and per-group caches."""

    closed: bool = False
    #: checked collectives, stall reports, section timeouts (None where unsupported)
    guard: Guard | None = None
    comms: dict[tuple[int, ...], Comm | None] = attrs.Factory(dict)
    on_close: list[Callable[[], None]] = attrs.Factory(list)


@attrs.frozen(eq=False, kw_only=True)
class DistContext:
    """A distributed configuration, fixed at creation.

    Use the module functions (``idist.all_reduce``...) or this object's methods; both
    have the same semantics (DESIGN.md §3). Create one with ``idist.initialize`` or
    ``idist.context``; never by hand.
    """

    backend: str
    rank: int
    world_size: int
    local_rank: int
    nproc_per_node: int
    node_rank: int
    nnodes: int
    device: torch.device
    #: What decided each field: variable names and values, or ``"argument"``.
    config: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    _state: _State = attrs.field(factory=_State, repr=False, alias="_state")

    MODEL_NAME: ClassVar[str] = "serial"
    VALID_OPS: ClassVar[tuple[str, ...]] = COMMON_OPS
    #: the backend's float64 SUM all_reduce is exact on integers below 2**53 and is ``a + b``
    #: for two ranks, so SUM/AVERAGE of Python numbers may use ``_number_sum``'s pair
    EXACT_SUM_PAIRS: ClassVar[bool] = False

    # ------------------------------------------------------------------ queries
    def get_rank(self) -> int:
        return self.rank

    def get_world_size(self) -> int:
        return self.world_size

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_node_rank(self) -> int:
        return self.node_rank

    def get_nnodes(self) -> int:
        return self.nnodes

    def get_nproc_per_node(self) -> int:
        return self.nproc_per_node

    def model_name(self) -> str:
        return self.MODEL_NAME

    def hostname(self) -> str:
        return socket.gethostname()

    @property
    def closed(self) -> bool:
        return self._state.closed

    def show_config(self) -> None:
        """Log the configuration (and what decided it) on the ``idist`` logger at INFO."""
        lines = [
            f"idist {type(self).__name__}: backend={self.backend} model={self.MODEL_NAME}",
            f"  rank={self.rank} world_size={self.world_size} local_rank={self.local_rank}",
            f"  nproc_per_node={self.nproc_per_node} node_rank={self.node_rank} nnodes={self.nnodes}",
            f"  device={self.device} hostname={self.hostname()}",
        ]
        lines += [f"  {k}: {v}" for k, v in self.config.items()]
        logger.info("\n".join(lines))

    # ----------------------------------------------------------- backend hooks
    def _world_comm(self) -> Comm | None:
        raise NotImplementedError

    def _make_comm(self, ranks: tuple[int, ...]) -> Comm | None:
        raise NotImplementedError

    def _native_group_comm(self, group: object) -> Comm | None:
        """The comm for a backend's own group object; None when this rank is not in it."""
        raise CollectiveInputError(f"group must be a list of global ranks or a group from new_group(), got {group!r}")

    def _allreduce_tensor(self, t: torch.Tensor, op: str, comm: Comm) -> None:
        raise NotImplementedError

    def _broadcast_tensor(self, t: torch.Tensor, src: int, comm: Comm) -> None:
        raise NotImplementedError

    def _receive_device(self, dtype: torch.dtype) -> torch.device:
        """Where ``broadcast`` puts a new tensor for a receiver that passed none that fits."""
        return self.device

    def _barrier(self, comm: Comm) -> None:
        raise NotImplementedError

    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _close(self) -> None:
        """Release backend resources (called once)."""

    # ---------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Finalize this context: release its process group, undo what creation changed.

        Safe to call twice. Any later collective raises ``ContextClosedError``.
        """
        state = self._state
        if state.closed:
            return
        state.closed = True
        try:
            self._close()
        finally:
            while state.on_close:
                state.on_close.pop()()

    def _check_open(self) -> None:
        if self._state.closed:
            raise ContextClosedError(
                f"this {type(self).__name__} was finalized; create a new one with "
                "idist.initialize(...) or idist.context(...)"
            )

    # ------------------------------------------------------------------ groups
    def new_group(self, ranks: Sequence[int]) -> Group:
        """A group of the given global ranks, usable as ``group=`` in any collective."""
        key = self._check_ranks(ranks)
        return Group(key, self._comm_for(key))

    def _check_ranks(self, ranks: object) -> tuple[int, ...]:
        try:
            members = list(ranks)  # type: ignore[call-overload]
        except TypeError:
            members = [None]
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in members):
            # ranks like "a", 1.7 or True are refused, never coerced
            raise CollectiveInputError(
                f"group must be a list of global ranks (ints) or a group from new_group(), got {ranks!r}"
            )
        key = tuple(sorted(set(members)))
        if not key or key[0] < 0 or key[-1] >= self.world_size:
            raise CollectiveInputError(f"group ranks {list(key)} must be non-empty and within 0..{self.world_size - 1}")
        return key

    def _comm_for(self, key: tuple[int, ...]) -> Comm | None:
        comms = self._state.comms
        if key not in comms:
            comms[key] = self._world_comm() if len(key) == self.world_size else self._make_comm(key)
        return comms[key]

    def _comm(self, group: GroupArg) -> Comm | None:
        """The comm for ``group``, or None when this rank is not in it."""
        self._check_open()
        if group is None:
            return self._world_comm()
        if isinstance(group, Group):
            handle = group.handle
            return handle if handle is not None else None  # type: ignore[return-value]
        if isinstance(group, (list, tuple, range)):
            return self._comm_for(self._check_ranks(group))
        return self._native_group_comm(group)

    # ------------------------------------------------------------- collectives
    @overload
    def all_reduce(self, x: TensorT, op: ReduceOp = "SUM", group: GroupArg = None) -> TensorT: ...
    @overload
    def all_reduce(self, x: bool, op: ReduceOp = "SUM", group: GroupArg = None) -> bool: ...
    @overload
    def all_reduce(self, x: int, op: ReduceOp = "SUM", group: GroupArg = None) -> int: ...
    @overload
    def all_reduce(self, x: float, op: ReduceOp = "SUM", group: GroupArg = None) -> float: ...
    def all_reduce(self, x: object, op: ReduceOp = "SUM", group: GroupArg = None) -> object:
        """Reduce ``x`` over the group (all ranks by default).

        Tensors are reduced in place and returned; Python ``int``/``float``/``bool`` give a
        new value of the same type, exact in int64/float64. Ranks outside ``group`` get
        ``x`` back unchanged. Raises ``UnsupportedOpError`` for an op this backend or data
        type cannot do (before communicating), ``ReduceOverflowError`` when an int result
        leaves int64, ``UnsupportedValueError`` for other types.
        """
        name = check_op_name(op, self.VALID_OPS, self.backend)
        comm = self._comm(group)
        if comm is None:
            return x
        self._checkpoint(comm, "all_reduce", name, value=x, shape=True)
        if isinstance(x, torch.Tensor):
            check_tensor_op(name, x.dtype)
            self._allreduce_tensor(x, name, comm)
            return x
        if len(comm.ranks) == 1:  # a group of one: the same checks, nothing to exchange
            check_value_op(name, x)
            return fold_values(name, [x])
        summing = self.EXACT_SUM_PAIRS and name in _number_sum.OPS and len(comm.ranks) < _number_sum.MAX_RANKS
        if summing and not comm.sum_by_gather:
            summed = _number_sum.pair(x, name)
            self._allreduce_tensor(summed, "SUM", comm)
            result = _number_sum.result(summed, len(comm.ranks), name)
            if not isinstance(result, _number_sum.Miss):
                return result
        try:
            check_value_op(name, x)
            frame = _codec.encode(x, allow_pickle=False)
        except IdistError as exc:
            frame = _codec.encode_error(exc)
        values = _exchange.decode_all(comm, _exchange.gather_frames(comm, frame), "all_reduce")
        if summing:
            comm.sum_by_gather = _number_sum.gather_next_time(values)
        return fold_values(name, values)

    @overload
    def all_gather(self, x: torch.Tensor, group: GroupArg = None) -> list[torch.Tensor]: ...
    @overload
    def all_gather(self, x: T, group: GroupArg = None) -> list[T]: ...
    def all_gather(self, x: object, group: GroupArg = None) -> list[Any]:
        """One entry per rank of the group, in rank order.

        Tensors may differ in shape between ranks (any dimension) but not in dtype.
        int/float/bool/str/bytes/Path round-trip exactly without pickle; other objects go
        through pickle (peers are trusted). A rank outside ``group`` gets ``[x]``.
        """
        comm = self._comm(group)
        if comm is None:
            return [x]
        self._checkpoint(comm, "all_gather", value=x)
        if len(comm.ranks) == 1:  # a group of one: the same checks and copy, nothing to exchange
            if isinstance(x, torch.Tensor):
                return [_codec.checked_tensor(x).detach().clone()]
            return [_codec.decode(_codec.encode(x).to_tensor())]
        try:
            frame = _codec.encode(x)
        except IdistError as exc:
            frame = _codec.encode_error(exc)
        values = _exchange.decode_all(comm, _exchange.gather_frames(comm, frame), "all_gather")
        if isinstance(x, torch.Tensor) or any(isinstance(v, torch.Tensor) for v in values):
            # also on the ranks that passed no tensor, so that every rank raises the mix
            return self._gathered_tensors(x, values, comm)
        return values

    def _gathered_tensors(self, x: object, values: list[object], comm: Comm) -> list[torch.Tensor]:
        if not all(isinstance(v, torch.Tensor) for v in values):
            kinds = {r: type(v).__name__ for r, v in zip(comm.ranks, values, strict=False)}
            raise CollectiveInputError(f"all_gather got a tensor on some ranks only: {kinds}")
        tensors: list[torch.Tensor] = values  # type: ignore[assignment]
        dtype = tensors[0].dtype
        if any(t.dtype != dtype for t in tensors):
            dtypes = {r: t.dtype for r, t in zip(comm.ranks, tensors, strict=False)}
            raise CollectiveInputError(
                f"all_gather needs the same dtype on every rank, got {dtypes}; cast with .to(dtype) before gathering"
            )
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            tensors = [t.to(x.device) for t in tensors]
        return tensors

    def broadcast(self, x: T | None, src: int = 0, group: GroupArg = None, *, safe_mode: bool = False) -> T:
        """Every rank returns ``src``'s value (``src`` is a global rank).

        Tensors land in place when the receiver passes one of the same shape and dtype;
        otherwise (or for ``None``) the receiver gets a new tensor on its device. Python
        values are exact. ``safe_mode`` is accepted for ignite code: receivers may always
        pass ``None``. Ranks outside ``group`` get ``x`` back unchanged.
        """
        del safe_mode
        comm = self._comm(group)
        if not isinstance(src, int) or isinstance(src, bool) or src < 0 or src >= self.world_size:
            raise CollectiveInputError(f"broadcast src must be a global rank in 0..{self.world_size - 1}, got {src!r}")
        if comm is None:
            return x  # type: ignore[return-value]
        if src not in comm.ranks:
            raise CollectiveInputError(
                f"broadcast src {src} is not in the group {list(comm.ranks)}; pass a member rank"
            )
        self._checkpoint(comm, "broadcast", src=str(src))
        if len(comm.ranks) == 1:  # a group of one: src's value is this rank's, once checked
            if isinstance(x, torch.Tensor):
                _codec.checked_tensor(x)
            else:
                _codec.encode(x)
            return x  # type: ignore[return-value]
        gsrc = comm.ranks.index(src)
        me = comm.group_rank == gsrc
        frame = self._broadcast_frame(x) if me else None
        buf = _exchange.broadcast_frame(comm, frame, gsrc)
        tag, code, shape = _codec.peek(buf)
        if tag is _codec.Tag.ERROR:
            _exchange.decode_all(comm, [buf], "broadcast")
        if tag is not _codec.Tag.TENSOR:
            return x if me else _codec.decode(buf)  # type: ignore[return-value]
        dtype = _codec.DTYPES[code]
        if me:
            target: torch.Tensor = x  # type: ignore[assignment]
        elif isinstance(x, torch.Tensor) and x.dtype == dtype and tuple(x.shape) == shape:
            target = x
        else:
            target = torch.empty(shape, dtype=dtype, device=self._receive_device(dtype))
        inline = _codec.frame_length(buf) > _codec.payload_start(len(shape)) or target.numel() == 0
        if inline:
            if not me:
                target.copy_(_codec.decode(buf))  # type: ignore[arg-type]
        else:
            self._broadcast_tensor(target, gsrc, comm)
        return target  # type: ignore[return-value]

    def _broadcast_frame(self, x: object) -> _codec.Frame:
        try:
            if isinstance(x, torch.Tensor) and x.numel() * x.element_size() > INLINE_TENSOR_BYTES:
                return _codec.tensor_header(x)
            return _codec.encode(x)
        except IdistError as exc:
            return _codec.encode_error(exc)

    def barrier(self, group: GroupArg = None) -> None:
        """Return only when every rank of the group has arrived."""
        comm = self._comm(group)
        if comm is not None:
            self._checkpoint(comm, "barrier")
            self._barrier(comm)

    def sync(self, group: GroupArg = None) -> None:
        """Wait for this rank's pending device work, then barrier."""
        self._check_open()
        self._sync_device()
        self.barrier(group)

    def _checkpoint(
        self, comm: Comm, call: str, op: str = "", data: str = "", src: str = "",
        *, value: object = _NO_VALUE, shape: bool = False,
    ) -> None:  # fmt: skip
        guard = self._state.guard
        if guard is not None and guard.checked:
            if value is not _NO_VALUE:
                # described only here: formatting a tensor's dtype/shape costs µs on every call
                data = _describe(value, shape=shape)
            guard.check(comm, fingerprint(call, op, data, src, comm.ranks))  # type: ignore[arg-type]

    @property
    def checked(self) -> bool:
        """Whether collectives are fingerprinted and compared across ranks first."""
        guard = self._state.guard
        return guard is not None and guard.checked

    def timeout(self, seconds: float) -> AbstractContextManager[None]:
        """``with ctx.timeout(s):`` bounds each collective in the block to ``s`` seconds.

        The process group's own timeout is unchanged. A collective that runs past it raises
        ``CollectiveTimeoutError`` naming the ranks that did not arrive; the group is then
        broken and must be finalized. Serial contexts never wait, so it has no effect there.
        """
        guard = self._state.guard
        if guard is None:
            if not seconds > 0:
                raise ValueError(f"timeout must be a positive number of seconds, got {seconds!r}")
            return nullcontext()
        return guard.section(seconds)

    def any_rank_failed(self, failed: bool, group: GroupArg = None) -> bool:
        """True on every rank when ``failed`` is true on any rank: consensus for user code."""
        return self.all_reduce(bool(failed), "OR", group)

    # -------------------------------------------------------- rank-only helpers
    def one_rank_only(self, rank: int = 0, with_barrier: bool = True) -> Callable[[F], F]:
        """Decorator: run the function on ``rank`` only (others get None), then barrier."""
        from ._rank_only import one_rank_only

        return one_rank_only(self, rank, with_barrier)

    def one_rank_first(self, rank: int = 0, local: bool = False) -> AbstractContextManager[None]:
        """Context manager: ``rank`` runs the block first, the others after it finished."""
        from ._rank_only import one_rank_first

        return one_rank_first(self, rank, local)

    # --------------------------------------------------------- training helpers
    def auto_model(self, model: nn.Module, sync_bn: bool = False, **kwargs: Any) -> nn.Module:
        """The model on this context's device, wrapped for this backend (DDP when distributed).

        Never wraps a DDP/DataParallel model twice. ``kwargs`` go to the wrapper; on CUDA
        ``device_ids`` comes from the context (passing it raises ``TrainingSetupError``).
        ``sync_bn`` converts BatchNorm to SyncBatchNorm (GPU only). See ``idist.training``.
        """
        from .training._model import auto_model

        return auto_model(self, model, sync_bn, **kwargs)

    def auto_optim(self, optimizer: OptimizerT, **kwargs: Any) -> OptimizerT:
        """The optimizer adapted for this backend (unchanged on serial and torch.distributed)."""
        from .training._optim import auto_optim

        return auto_optim(self, optimizer, **kwargs)

    def auto_dataloader(self, data: Dataset[T] | DataLoader[T], **kwargs: Any) -> AutoDataLoader[T]:
        """A loader giving this rank its share: ``batch_size`` is the global batch.

        Takes a Dataset (plus DataLoader keyword arguments) or a DataLoader (its settings,
        overridden by ``kwargs``). Also ``per_rank_batch_size=``, ``seed=``,
        ``shard_iterable=``, ``even_batches=``. See ``idist.training._dataloader``.
        """
        from .training._dataloader import auto_dataloader

        return auto_dataloader(self, data, **kwargs)

    # Training hooks: what a backend overrides; the shared logic calls them.
    def _wrap_model(self, model: nn.Module, sync_bn: bool, kwargs: dict[str, Any]) -> nn.Module:
        from .training._model import wrap_single_process

        return wrap_single_process(self, model, sync_bn, kwargs)

    def _wrap_optimizer(self, optimizer: OptimizerT, kwargs: dict[str, Any]) -> OptimizerT:
        from .training._optim import keep_optimizer

        return keep_optimizer(self, optimizer, kwargs)

    def _loader_pin_memory(self, requested: bool | None) -> bool:
        return self.device.type == "cuda" if requested is None else bool(requested)

    def _adapt_loader(self, loader: AutoDataLoader[T]) -> AutoDataLoader[T]:
        return loader


def _describe(x: object, *, shape: bool) -> str:
    """What a checked collective compares about a value (shape only where it must match)."""
    if isinstance(x, torch.Tensor):
        return f"tensor {x.dtype} {tuple(x.shape)}" if shape else f"tensor {x.dtype}"
    return type(x).__name__ if shape else "value"
