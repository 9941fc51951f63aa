"""``HorovodContext``: an initialized Horovod runtime (``horovod.torch``) and its topology.

Horovod's in-place ops keep ``all_reduce(t)`` in place; dtypes and ops it lacks are staged,
folded or emulated (``_fold``); groups are process sets (registering one is collective).
How each difference is bridged: docs/horovod.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Self, TypeVar, final

import attrs
import torch
from torch import nn

from ... import _codec, _exchange
from ..._context import DistContext
from ..._errors import CollectiveInputError, TrainingSetupError, UnsupportedOpError
from ..._group import Group, check_ranks
from ..._inplace import resolved, write
from ..._types import COMMON_OPS, GroupArg
from . import _create, _lib, _training
from ._comm import HorovodComm, register_process_set
from ._fold import NATIVE_REDUCE, WIDEN, adasum_tree, fold_tensors

if TYPE_CHECKING:
    from horovod.torch import ProcessSet

    from ...training._options import OptimOptions

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


@final
@attrs.frozen(eq=False, kw_only=True)
class HorovodContext(DistContext[HorovodComm]):
    """An initialized Horovod runtime (``horovod.torch``) and its topology."""

    MODEL_NAME = "horovod-dist"
    VALID_OPS = (*COMMON_OPS, "ADASUM")
    INSTALL_HINT: ClassVar[str | None] = _lib.INSTALL_HINT
    ADOPTS_FROM: ClassVar[str | None] = "horovod.torch"
    #: True when this context called hvd.init() and must call hvd.shutdown() on close
    _owns_init: bool = attrs.field(repr=False, default=False, alias="_owns_init")

    # ------------------------------------------------------------- factories
    @classmethod
    def create(cls, name: str, /, *, timeout: float | None = None, **unknown: object) -> Self:
        return _create.create(cls, name, timeout=timeout, **unknown)

    @classmethod
    def is_available(cls, name: str) -> bool:
        return _create.is_available()

    @classmethod
    def adopt(cls) -> Self | None:
        return _create.adopt(cls)

    def still_adopted(self) -> bool:
        return _lib.hvd is not None and _lib.hvd.is_initialized()

    # ----------------------------------------------------------- backend hooks
    def _make_comm(self, ranks: tuple[int, ...]) -> HorovodComm | None:
        # Registering a process set is collective: members and non-members all call it.
        ps = register_process_set(ranks)
        if self.rank not in ranks:
            return None
        return HorovodComm(ps, ranks, ranks.index(self.rank))

    def _native_group_comm(self, group: object) -> HorovodComm | None:
        if not isinstance(group, _lib.hvd.ProcessSet):
            return super()._native_group_comm(group)
        if group.process_set_id is None or group.ranks is None:
            raise CollectiveInputError(
                f"{group} is not registered with Horovod; pass it to hvd.add_process_set() "
                "(or hvd.init(process_sets=[...])) first, or pass a list of ranks as group="
            )
        comms = self._state.group_comms
        if group not in comms:
            ranks = tuple(group.ranks)
            comms[group] = self._process_set_comm(group, ranks) if self.rank in ranks else None
        return comms[group]

    def _process_set_comm(self, group: ProcessSet, ranks: tuple[int, ...]) -> HorovodComm:
        """One comm per registered set: a second ProcessSet object with the same id shares it (and
        so its call counter, which names the ops). Keyed by object, not id: Horovod may give a
        removed set's id to a new set, and removing a set clears the id of every object for it."""
        for comm in self._state.group_comms.values():
            if comm is not None and comm.process_set.process_set_id == group.process_set_id:
                return comm
        return HorovodComm(group, ranks, ranks.index(self.rank))

    def _allreduce_tensor(self, t: torch.Tensor, op: str, comm: HorovodComm) -> None:
        dtype = t.dtype
        if t.device.type != "cpu" and not _lib.hvd.cuda_built():
            work = t.cpu()
            self._allreduce_tensor(work, op, comm)
            write(t, work)
        elif dtype in NATIVE_REDUCE and op not in ("AND", "OR"):
            comm.allreduce(t, op)
        elif dtype == torch.bool:
            work = t.to(torch.int32)
            comm.allreduce(work, {"AND": "MIN", "OR": "MAX"}.get(op, op))
            write(t, work)
        elif dtype in WIDEN and op not in ("AND", "OR"):
            work = t.to(WIDEN[dtype])
            comm.allreduce(work, op)
            write(t, work)
        elif dtype.is_complex:
            work = torch.view_as_real(resolved(t).contiguous())
            comm.allreduce(work, op)
            write(t, torch.view_as_complex(work))
        elif dtype == torch.uint64 and op in ("SUM", "PRODUCT"):
            # Same bits modulo 2**64 as unsigned arithmetic.
            work = t.contiguous().view(torch.int64)
            comm.allreduce(work, op)
            write(t, work.view(torch.uint64))
        else:
            write(t, fold_tensors(op, self._gather_same_shape(t, comm, op)))

    def _gather_same_shape(self, t: torch.Tensor, comm: HorovodComm, op: str) -> list[torch.Tensor]:
        """Every rank's exact tensor, checked for the same shape and dtype on every rank."""
        frames = _exchange.gather_frames(comm, _codec.encode_tensor(t))
        values = _exchange.decode_all(comm, frames, "all_reduce")
        kinds = {
            r: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else type(v).__name__
            for r, v in zip(comm.ranks, values, strict=True)
        }
        if len(set(kinds.values())) > 1:
            raise CollectiveInputError(
                f"all_reduce({op}) needs the same tensor shape and dtype on every rank, got {kinds}"
            )
        return [v.to(t.device) for v in values if isinstance(v, torch.Tensor)]

    def _broadcast_tensor(self, t: torch.Tensor, src: int, comm: HorovodComm) -> None:
        if t.device.type != "cpu" and not _lib.hvd.cuda_built():
            work = t.cpu()
            comm.broadcast(work, src)
            if src != comm.group_rank:  # src's own tensor is only read
                write(t, work)
        else:
            comm.broadcast(t, src)

    def _pipeline(self, comm: HorovodComm) -> HorovodComm | None:
        return comm if self.device.type == "cpu" else None

    def _barrier(self, comm: HorovodComm) -> None:
        comm.barrier()

    def _close(self) -> None:
        self._state.comms.clear()
        self._state.group_comms.clear()
        hvd = _lib.hvd
        if self._owns_init and hvd.is_initialized():
            hvd.shutdown()

    # --------------------------------------------------------- training hooks
    def _wrap_model(self, model: nn.Module, sync_bn: bool, kwargs: dict[str, object]) -> nn.Module:
        return _training.wrap_model(self, model, sync_bn, kwargs)

    def _wrap_optimizer(self, optimizer: OptimizerT, kwargs: OptimOptions) -> OptimizerT:
        return _training.wrap_optimizer(self, optimizer, kwargs)

    def _check_no_sync(self) -> None:
        raise TrainingSetupError(
            "no_sync on Horovod: hvd.DistributedOptimizer exchanges gradients in its backward hooks, not in the "
            "model; for K micro-batches per step pass auto_optim(optimizer, backward_passes_per_step=K) and call "
            "step() every K backward passes"
        )

    # ------------------------------------------------------------- collectives
    def _all_reduce(self, x: object, op: str, group: GroupArg) -> object:
        # op="ADASUM" (typed by DistContext.all_reduce's overload for this context) for tensors alone
        if op == "ADASUM":
            return self._adasum(x, group)
        return super()._all_reduce(x, op, group)

    def _group_ranks(self, group: object) -> tuple[int, ...]:
        if isinstance(group, Group):
            return group.ranks
        if isinstance(group, _lib.hvd.ProcessSet):
            return tuple(group.ranks or ())
        return check_ranks(group, self.world_size)

    def _adasum(self, x: object, group: GroupArg) -> object:
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
            what = f"{x.dtype} tensors" if isinstance(x, torch.Tensor) else type(x).__name__
            raise UnsupportedOpError(
                f"op 'ADASUM' is not valid for {what}; it combines floating-point tensors (gradients). "
                "Use SUM or AVERAGE here"
            )
        if group is not None and self._group_ranks(group) != tuple(range(self.world_size)):
            # decided on every rank alike, members or not
            raise UnsupportedOpError("op 'ADASUM' works on all ranks only (Horovod has no Adasum for process sets)")
        self._check_open()
        n = self.world_size
        if n & (n - 1):
            raise UnsupportedOpError(f"op 'ADASUM' needs a power-of-two number of ranks, this world has {n}")
        world = self._state.world
        if x.device.type not in world.no_native_adasum:
            try:
                world.allreduce(x, "ADASUM")
                return x
            except _lib.hvd.HorovodInternalError as exc:
                # raised on every rank alike, so every rank switches to the emulation
                if "No Adasum operation" not in str(exc):
                    raise
                world.no_native_adasum.add(x.device.type)
        write(x, adasum_tree(self._gather_same_shape(x, world, "ADASUM")))
        return x
