"""``NativeContext``: a torch.distributed process group (gloo, nccl, mpi) and its topology."""

from __future__ import annotations

import datetime
import weakref
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Self, final

import attrs
import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, Store

from ... import _records
from ..._context import DistContext
from ..._errors import CollectiveInputError, IdistError, UnsupportedValueError
from ..._inplace import resolved, write
from . import _adopt, _create, _ddp
from ._comm import NativeComm
from ._guard import describe, fingerprint
from ._inflight import Unheld
from ._keys import built, group_key

#: dtypes gloo has no kernels for (torch 2.13): broadcast moves their bytes, all_reduce refuses them
_GLOO_MISSING = frozenset({torch.int16, torch.uint16, torch.uint32, torch.uint64})


@final
@attrs.frozen(eq=False, kw_only=True)
class NativeContext(DistContext[NativeComm]):
    """A torch.distributed process group (gloo, nccl or mpi) and its topology."""

    MODEL_NAME = "native-dist"
    ADOPTS_FROM: ClassVar[str | None] = "torch.distributed"
    #: the process group's own timeout (``ctx.timeout(s)`` bounds a section without changing it)
    pg_timeout: datetime.timedelta = attrs.field(repr=False, default=_create.DEFAULT_TIMEOUT)
    #: the local address this rank's gloo connections use (None: torch's choice, for an adopted group)
    bind_address: str | None = attrs.field(repr=False, default=None)
    _store: Store | None = attrs.field(repr=False, default=None, alias="_store")
    #: True when this context created the default group and must destroy it on close
    _owns_default: bool = attrs.field(repr=False, default=False, alias="_owns_default")
    #: an in-process transport's maker of process groups (simulated ranks; torch.distributed knows none)
    _groups: _create.GroupMaker | None = attrs.field(repr=False, default=None, alias="_groups")

    # ------------------------------------------------------------- factories
    @classmethod
    def create(cls, name: str, /, **options: Any) -> Self:
        return _create.create(cls, name, **options)

    @classmethod
    def is_available(cls, name: str) -> bool:
        return _create.is_available(name)

    @classmethod
    def unavailable_reason(cls, name: str) -> str:
        return _create.unavailable_reason(name)

    @classmethod
    def adopt(cls) -> Self | None:
        return _adopt.adopt(cls)

    @property
    def process_group(self) -> dist.ProcessGroup:
        """The torch ``ProcessGroup`` of all ranks: what DDP and torch.distributed calls take (for
        simulated ranks, one built around their gloo group on first use)."""
        return _ddp.torch_group(self)

    def still_adopted(self) -> bool:
        """Whether the torch group this context adopted is still torch's default group."""
        return dist.is_initialized() and dist.group.WORLD is self._state.world.pg

    @classmethod
    def in_process(
        cls,
        store: Store,
        rank: int,
        world_size: int,
        *,
        timeout: float | datetime.timedelta | None = None,
        checked: bool | None = None,
        groups: _create.GroupMaker | None = None,
    ) -> NativeContext:
        """A gloo context over ``store`` that does not touch torch's default group.

        Several of these live in one process, one per thread, for simulated ranks. ``groups``
        (an in-process transport) makes its process groups instead of gloo over ``store``.
        """
        return _create.create_in_process(cls, store, rank, world_size, timeout, checked, groups)

    # ------------------------------------------------------------------ groups
    def _make_comm(self, ranks: tuple[int, ...]) -> NativeComm | None:
        if self.rank not in ranks:
            return None
        world = self._state.world
        key = group_key(ranks)  # a fixed length, whatever the group's size
        grank = ranks.index(self.rank)
        if self._groups is not None:
            return NativeComm(self._groups(ranks, grank), ranks, grank, world.guard, key=key, inflight=Unheld())
        if self._store is None or self.backend not in ("gloo", "nccl"):
            raise CollectiveInputError(
                f"subgroups on a {self.backend} context without a store are not supported; "
                "create the group with torch.distributed.new_group and pass it as group="
            )
        store = PrefixStore(f"{world.guard.namespace}/{key}", self._store)
        pg: Any
        if self.backend == "gloo" and self.bind_address is not None:
            opts = ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # private in torch's stubs
            opts._timeout = self.pg_timeout
            opts._devices = [ProcessGroupGloo.create_device(hostname=self.bind_address)]
            pg = ProcessGroupGloo(store, grank, len(ranks), opts)
        elif self.backend == "gloo":
            pg = ProcessGroupGloo(store, grank, len(ranks), self.pg_timeout)
        else:
            pg = dist.ProcessGroupNCCL(store, grank, len(ranks), dist.ProcessGroupNCCL.Options())
        if self.backend == "gloo":
            built(store, len(ranks))  # gloo's rendezvous keys: deleted once every member connected
        return NativeComm(pg, ranks, grank, world.guard, stage=world.stage, key=key, slice=world.slice)

    def _native_group_comm(self, group: object) -> NativeComm | None:
        if type(group) is int and group == dist.GroupMember.NON_GROUP_MEMBER:
            return None  # what torch.distributed.new_group gives a rank outside the group
        if not isinstance(group, dist.ProcessGroup):
            return super()._native_group_comm(group)
        comms = self._state.group_comms
        if group not in comms:
            ranks = tuple(dist.get_process_group_ranks(group))
            world = self._state.world
            # The comm reaches its group through a weak proxy, so that the entry (weakly keyed)
            # goes with the group; torch names a group alike on every rank, its id() differs.
            comms[group] = (
                NativeComm(
                    weakref.proxy(group),
                    ranks,
                    ranks.index(self.rank),
                    world.guard,
                    stage=world.stage,
                    key=f"n{group.group_name}",
                    flat=world.flat,
                    slice=world.slice,
                )
                if self.rank in ranks
                else None
            )
        return comms[group]

    # ------------------------------------------------------- tensor primitives
    def _check_tensor(self, t: torch.Tensor, op: str) -> None:
        super()._check_tensor(t, op)
        if self.backend == "gloo" and t.dtype in _GLOO_MISSING:
            # gloo fails these mid-call ("Invalid scalar type") and the group is lost: refuse first
            raise UnsupportedValueError(
                f"gloo cannot reduce {t.dtype} tensors; reduce a torch.int32/torch.int64 copy "
                "(t.copy_(ctx.all_reduce(t.to(torch.int64), op))) instead"
            )

    def _allreduce_tensor(self, t: torch.Tensor, op: str, comm: NativeComm) -> None:
        if op == "AVERAGE" and self.backend != "nccl":
            comm.allreduce(t, "SUM", divisor=len(comm.ranks))  # gloo and mpi have no AVG
            return
        comm.allreduce(t, op)

    def _numbers(self, comm: NativeComm, x: object, op: str) -> list[object] | None:
        return _records.exchange(comm.alltoall_bytes, comm.ranks, x, op)

    def _broadcast_tensor(self, t: torch.Tensor, src: int, comm: NativeComm) -> None:
        if self.backend == "gloo" and t.dtype in _GLOO_MISSING:
            # a broadcast moves bits: send them as bytes, a dtype gloo has
            work = resolved(t).contiguous()
            comm.broadcast(work.reshape(-1).view(torch.uint8), src)
            if work is not t and src != comm.group_rank:  # src's own tensor is only read
                write(t, work)
            return
        comm.broadcast(t, src)

    def _pipeline(self, comm: NativeComm) -> NativeComm | None:
        # gloo runs two broadcasts at once on CPU; nccl's are asynchronous already
        return comm if self.backend == "gloo" and self.device.type == "cpu" and comm.stage is None else None

    def _barrier(self, comm: NativeComm) -> None:
        if comm.guard.checked and len(comm.ranks) > 1 and self.backend == "gloo":
            return  # checked mode just compared this call over the group: every rank has arrived
        if self.backend == "nccl":
            comm.calling = "barrier"  # what a failure of the all_reduce below names
            try:
                comm.allreduce(torch.zeros(1, device=self.device), "SUM")
            finally:
                comm.calling = None
        else:
            comm.barrier()

    # ------------------------------------------------- checked mode, timeouts
    @property
    def checked(self) -> bool:
        return self._state.world.guard.checked

    def _checkpoint(
        self, comm: NativeComm, call: str, *, op: str, src: str, value: object, error: IdistError | None
    ) -> None:
        guard = comm.guard
        if guard.checked and len(comm.ranks) > 1:
            # described only here: formatting a tensor's dtype/shape costs µs on every call
            guard.check(comm, fingerprint(call, op, describe(call, value), src, comm.ranks), error)
        elif error is not None:
            # on the world, the call may have meant a group (a bad group=): peers waiting in one find it too
            state = self._state
            others = [c for c in (*state.comms.values(), *state.group_comms.values()) if c not in (None, comm)]
            on_world = comm is state.world
            verdict = guard.agree(comm, call, error, others if on_world else []) if len(comm.ranks) > 1 else None
            if verdict is not None:
                self._break(verdict.reason)
                error.add_note(
                    "the other ranks did not fail at the same call, so the group is now broken on every rank: "
                    "finalize this context and create a new one"
                )
            raise error

    def _broken(self) -> str | None:
        return self._state.world.guard.broken

    def _break(self, reason: str) -> None:
        """Tell the peers why, then release every process group of this rank: closing their
        connections wakes every peer blocked on this rank, and each later call raises at once."""
        state = self._state
        state.world.guard.publish_broken(reason)
        for comm in (state.world, *state.comms.values(), *state.group_comms.values()):
            if comm is not None:
                comm.release(reason)

    def timeout(self, seconds: float) -> AbstractContextManager[None]:
        return self._state.world.guard.section(seconds)

    # ------------------------------------------------------------ lifecycle
    def _wrap_model(self, model: nn.Module, sync_bn: bool, kwargs: dict[str, Any]) -> nn.Module:
        return _ddp.wrap_ddp(self, model, sync_bn, kwargs)

    def _shard_model(self, model: nn.Module, sync_bn: bool, kwargs: dict[str, Any]) -> nn.Module:
        from . import _fsdp  # slow: torch.distributed.fsdp adds ~1 s to every import; loaded on first use

        return _fsdp.shard(self, model, sync_bn, kwargs)

    def _dcp_group(self) -> dist.ProcessGroup | None:
        # simulated ranks' groups are not registered with torch.distributed, which DCP needs
        pg = self._state.world.pg
        return pg if self.world_size > 1 and isinstance(pg, dist.ProcessGroup) and self._groups is None else None

    def _close(self) -> None:
        # let the worker threads drop finished work while the interpreter is whole (_inflight)
        state = self._state
        for comm in (state.world, *state.comms.values(), *state.group_comms.values()):
            if comm is not None:
                comm.inflight.drain()
        state.comms.clear()
        state.group_comms.clear()
        if self._owns_default and dist.is_initialized() and dist.group.WORLD is self._state.world.pg:
            dist.destroy_process_group()
