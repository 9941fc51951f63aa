"""``ContextCore``: what every context is made of, and what a backend implements.

A context's fields are fixed at creation; all that changes (lifecycle, comms and their
caches) lives in its one ``ContextState``. A backend subclasses ``DistContext`` and
implements the factory classmethods and the abstract hooks declared here; mypy rejects
one that forgets a hook. Design notes: docs/design.md.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Self, TypeVar

import attrs
import torch
from typing_extensions import TypeVar as DefaultTypeVar

from ._codec import checked_tensor
from ._errors import CollectiveInputError, ContextClosedError, GroupBrokenError, IdistError, TrainingSetupError
from ._exchange import Comm
from ._group import Group, check_ranks
from ._inplace import check_writable
from ._reduce import check_tensor_op
from ._speculative import Pipeline
from ._topology import Topology
from ._types import COMMON_OPS, GroupArg, ModelName
from .training import _model, _optim

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed import ProcessGroup
    from torch.optim import Optimizer

    from .training import AutoDataLoader
    from .training._feed import Feed
    from .training._options import OptimOptions

T = TypeVar("T")
OptimizerT = TypeVar("OptimizerT", bound="Optimizer")
#: a comm type, in ``ContextState`` and the hooks (a hook's ``self`` gives it: ``ContextCore[CommT]``)
CommT = TypeVar("CommT", bound=Comm)
#: a context's comm type: covariant, so a ``NativeContext`` is a ``DistContext``; a bare ``DistContext``
#: is ``DistContext[Comm]``, any backend's, and so only the calls every backend takes type-check on it
CommT_co = DefaultTypeVar("CommT_co", bound=Comm, default=Comm, covariant=True)


@attrs.define(eq=False)
class ContextState(Generic[CommT]):
    """The only mutable part of a context: lifecycle, comms (with their caches), the training feed."""

    world: CommT
    #: comms of subgroups given as global ranks (a list, a ``Group``), by their rank tuple
    comms: dict[tuple[int, ...], CommT | None] = attrs.Factory(dict)
    #: comms of the backend's own group objects (``_native_group_comm``), keyed by the object
    #: itself, never by its ``id()``, which a later group may reuse once this one is gone
    group_comms: weakref.WeakKeyDictionary[object, CommT | None] = attrs.Factory(weakref.WeakKeyDictionary)
    on_close: list[Callable[[], None]] = attrs.Factory(list)
    #: the weight and place of the batch this rank's loaders yielded last (training/_feed.py)
    feed: Feed | None = None
    closed: bool = False
    #: set by the context that owns this state; a second one (``attrs.evolve``) is refused
    owned: bool = False


@attrs.frozen(eq=False, kw_only=True)
class ContextCore(ABC, Generic[CommT_co]):
    """Fields, lifecycle and backend hooks of a context (``DistContext`` adds the API)."""

    backend: str
    topology: Topology
    device: torch.device
    #: What decided each field: variable names and values, or ``"argument"``.
    config: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    _state: ContextState[CommT_co] = attrs.field(repr=False, alias="_state")

    MODEL_NAME: ClassVar[ModelName] = "serial"
    VALID_OPS: ClassVar[tuple[str, ...]] = COMMON_OPS
    #: a runtime of this backend can only be running (and be adopted) once this is imported
    ADOPTS_FROM: ClassVar[str | None] = None
    #: how to install the optional package this backend needs (None: nothing to install)
    INSTALL_HINT: ClassVar[str | None] = None

    def __attrs_post_init__(self) -> None:
        if self._state.owned:
            raise TypeError(
                f"a {type(self).__name__} cannot be copied (attrs.evolve): the copy would share its process "
                "group and lifecycle; create another one with idist.initialize(...) or idist.context(...)"
            )
        self._state.owned = True

    def __copy__(self) -> Self:
        raise TypeError(f"a {type(self).__name__} cannot be copied; pass the context itself around")

    def __deepcopy__(self, memo: dict[int, object]) -> Self:
        return self.__copy__()

    # ------------------------------------------------------ factory classmethods
    @classmethod
    @abstractmethod
    def create(cls, name: str, /, **options: Any) -> Self:
        """A new context for backend ``name`` (``initialize``'s options, each backend its own)."""

    @classmethod
    @abstractmethod
    def is_available(cls, name: str) -> bool:
        """Whether backend ``name`` can be selected here (never imports an optional package)."""

    @classmethod
    def unavailable_reason(cls, name: str) -> str:
        """Why backend ``name`` cannot run here, and what to do (asked when ``is_available`` is False)."""
        return cls.INSTALL_HINT or f"backend {name!r} cannot run here"

    @classmethod
    def adopt(cls) -> Self | None:
        """A context for a runtime of this backend the user started, or None."""
        return None

    def still_adopted(self) -> bool:
        """Whether the runtime this adopted context wraps is still the one running."""
        return False

    # ----------------------------------------------------------- backend hooks
    @abstractmethod
    def _make_comm(self, ranks: tuple[int, ...]) -> CommT_co | None:
        """The comm of a subgroup (every rank calls it); None where this rank is not in it."""

    def _native_group_comm(self, group: object) -> CommT_co | None:
        """The comm for a backend's own group object; None when this rank is not in it."""
        raise CollectiveInputError(f"group must be a list of global ranks or a group from new_group(), got {group!r}")

    @abstractmethod
    def _allreduce_tensor(self: ContextCore[CommT], t: torch.Tensor, op: str, comm: CommT) -> None:
        """Reduce ``t`` in place over ``comm`` (``op`` already valid for ``t``'s dtype)."""

    @abstractmethod
    def _broadcast_tensor(self: ContextCore[CommT], t: torch.Tensor, src: int, comm: CommT) -> None:
        """Broadcast ``t`` in place from group rank ``src`` (same shape and dtype everywhere)."""

    @abstractmethod
    def _barrier(self: ContextCore[CommT], comm: CommT) -> None: ...

    def _numbers(self: ContextCore[CommT], comm: CommT, x: object, op: str) -> list[object] | None:
        """Every rank's Python number for all_reduce with ``op`` in one fast round, or None to gather frames
        (a backend without one, or a value no fast round carries, on any rank: the same on all)."""
        return None

    def _pipeline(self: ContextCore[CommT], comm: CommT) -> Pipeline | None:
        """``comm`` when it can send a broadcast's header and data together (see _speculative)."""
        return None

    def _receive_device(self, dtype: torch.dtype) -> torch.device:
        """Where ``broadcast`` puts a new tensor for a receiver that passed none that fits."""
        return self.device

    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _checkpoint(
        self: ContextCore[CommT], comm: CommT, call: str, *, op: str, src: str, value: object, error: IdistError | None
    ) -> None:
        """Before a collective moves data: ``error`` is what this rank found wrong on its own.

        A backend raises it so that no peer is left waiting or paired with a later call (native:
        agreed through the store, or the group broken; XLA: shipped in the exchange that agrees
        on a tensor's op, dtype and shape); checked mode also compares the calls.
        """
        if error is not None:
            raise error

    def _stand_by(self: ContextCore[CommT], comm: CommT, call: str, src: int, error: IdistError | None) -> None:
        """Take this rank's part in ``call`` over ``comm`` from outside its group (a *bystander*).

        Only a backend whose collectives every rank of the world runs has bystanders (XLA): its
        ``_make_comm`` gives a rank outside the group a comm with ``group_rank == -1``. The rank
        then returns its input, or raises ``error`` (what it found wrong on its own, as ``src``
        outside the group may be), as any rank outside a group does.
        """

    def _check_tensor(self, t: torch.Tensor, op: str) -> None:
        """What this rank can tell alone about a tensor it is about to reduce (in place)."""
        check_tensor_op(op, t.dtype)
        checked_tensor(t)
        check_writable(t, "all_reduce")

    def _broken(self) -> str | None:
        """Why the group cannot be used any more (a backend that can break says), else None."""
        return None

    def _close(self) -> None:
        """Release backend resources (called once)."""

    # ---------------------------------------------------------------- lifecycle
    @property
    def closed(self) -> bool:
        return self._state.closed

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
        broken = self._broken()
        if broken is not None:
            raise GroupBrokenError(
                f"the group is broken ({broken}); finalize this {type(self).__name__} and create a new one"
            )

    # ------------------------------------------------------------------ groups
    def _comm_for(self, key: tuple[int, ...]) -> CommT_co | None:
        comms = self._state.comms
        if key not in comms:
            comms[key] = self._state.world if len(key) == self.topology.world_size else self._make_comm(key)
        return comms[key]

    def _enter(self, group: GroupArg) -> tuple[CommT_co | None, IdistError | None]:
        """The comm of ``group`` (None, or a bystander's with ``group_rank == -1``: not a member);
        for a bad group, the world's and the error."""
        self._check_open()
        if group is None:
            return self._state.world, None
        try:
            return self._comm(group), None
        except IdistError as exc:
            return self._state.world, exc

    def _outside(
        self: ContextCore[CommT], comm: CommT | None, call: str, x: T, error: IdistError | None, src: int = -1
    ) -> T:
        """What a rank outside the group returns: ``x``, once a bystander took its part (``_stand_by``)."""
        if comm is not None:
            self._stand_by(comm, call, src, error)
        if error is not None:
            raise error
        return x

    def _comm(self, group: GroupArg) -> CommT_co | None:
        """The comm for ``group``, or None when this rank is not in it."""
        self._check_open()
        if group is None:
            return self._state.world
        if isinstance(group, Group):
            return self._comm_for(group.ranks)
        if isinstance(group, (list, tuple, range)):
            return self._comm_for(check_ranks(group, self.topology.world_size))
        return self._native_group_comm(group)

    # Training hooks: what a backend overrides; the shared logic calls them.
    def _wrap_model(self, model: nn.Module, sync_bn: bool, kwargs: dict[str, object]) -> nn.Module:
        return _model.wrap_single_process(self, model, sync_bn, kwargs)

    def _shard_model(self, model: nn.Module, sync_bn: bool, kwargs: dict[str, object]) -> nn.Module:
        """``auto_model(strategy="fsdp")``; a backend that cannot shard says what to use instead."""
        raise TrainingSetupError(
            f"auto_model(strategy='fsdp') needs torch.distributed; {type(self).__name__} ({self.backend}) "
            "replicates the model instead: use strategy='ddp' (the default) here, or launch with the gloo or "
            "nccl backend (idist run, torchrun) to shard"
        )

    def _check_no_sync(self) -> None:
        """Raise where ``no_sync`` cannot skip the gradient exchange."""

    def _dcp_group(self) -> ProcessGroup | None:
        """The torch process group checkpoints are written over; None: rank 0 writes a replicated model alone."""
        return None

    def _wrap_optimizer(self, optimizer: OptimizerT, kwargs: OptimOptions) -> OptimizerT:
        return _optim.keep_optimizer(self, optimizer, kwargs)

    def _loader_pin_memory(self, requested: bool | None) -> bool:
        return self.device.type == "cuda" if requested is None else bool(requested)

    def _adapt_loader(self, loader: AutoDataLoader[T]) -> AutoDataLoader[T]:
        return loader
