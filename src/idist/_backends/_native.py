"""torch.distributed backends (gloo, nccl, mpi): ``NativeContext``.

A context owns its process group and talks to it only through the group object's own
methods (``pg.allreduce``...), never through torch's module-level default group, so
several contexts can live in one process (simulated ranks in threads) and a call costs
no more than the C++ call itself.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from typing import Any, Protocol, cast, final

import attrs
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    BarrierOptions,
    BroadcastOptions,
    PrefixStore,
    ProcessGroupGloo,
    Store,
    TCPStore,
    Work,
)

from .._context import DistContext
from .._errors import (
    AlreadyInitializedError,
    BackendUnavailableError,
    CollectiveInputError,
    LaunchEnvironmentError,
    UnsupportedValueError,
)
from .._guard import Guard, checked_from_env
from .._launch_env import LaunchInfo, detect
from ._inflight import InFlight

DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)
LOOPBACK = "127.0.0.1"

_TORCH_OPS = {
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
    def broadcast(self, tensors: list[torch.Tensor], opts: BroadcastOptions, /) -> Work: ...
    def barrier(self, opts: BarrierOptions = ..., /) -> Work: ...


#: dtypes gloo has no kernels for (torch 2.13): broadcast moves their bytes, all_reduce refuses them
_GLOO_MISSING = frozenset({torch.int16, torch.uint16, torch.uint32, torch.uint64})


def _options(op: str, timeout: datetime.timedelta | None = None) -> AllreduceOptions:
    opts = AllreduceOptions()
    opts.reduceOp = _TORCH_OPS[op]  # type: ignore[assignment]
    if timeout is not None:
        opts.timeout = timeout
    return opts


_OPTIONS = {op: _options(op) for op in _TORCH_OPS}

#: ids of the default groups that an idist context created: those are never "adopted"
#: by another thread's current(), which must not see a context scoped elsewhere.
_CREATED: set[int] = set()


@attrs.define(eq=False)
class NativeComm:
    """Byte and tensor collectives over one torch ProcessGroup."""

    pg: PGLike
    ranks: tuple[int, ...]
    group_rank: int
    #: where tensors must live for this backend (cuda for nccl), None for anywhere
    stage: torch.device | None = None
    slot: int = 64
    sum_by_gather: bool = False
    #: failure reports, checked mode and section timeouts (None: adopted without a store)
    guard: Guard | None = None
    #: this group's namespace in the store, and its collective counters (see _guard)
    key: str = "world"
    seq: int = 0
    check_seq: int = 0
    #: gather straight into one flat buffer (``_allgather_base``: one copy less); not on mpi
    flat: bool = True
    #: tensors the group's worker threads may still hold (see _inflight)
    inflight: InFlight = attrs.Factory(InFlight)

    def _wait(self, work: Callable[[], Work], what: str, *tensors: torch.Tensor) -> None:
        self.seq += 1
        counts = self.inflight.before(tensors)
        failed = True
        try:
            work().wait()
            failed = False
        except RuntimeError as exc:
            if self.guard is None:
                raise
            raise self.guard.failure(self, exc, what) from exc
        finally:
            self.inflight.after(tensors, counts, failed)

    def _timeout(self) -> datetime.timedelta | None:
        guard = self.guard
        return guard.sections[-1] if guard is not None and guard.sections else None

    def allgather_bytes(self, buf: torch.Tensor) -> torch.Tensor:
        n = len(self.ranks)
        if self.stage is not None:
            buf = buf.to(self.stage)
        out = torch.empty(n * buf.numel(), dtype=torch.uint8, device=buf.device)
        opts = AllgatherOptions()
        timeout = self._timeout()
        if timeout is not None:
            opts.timeout = timeout
        if self.flat:
            self._wait(lambda: self.pg._allgather_base(out, buf, opts), "all_gather", out, buf)
        else:
            chunks = out.chunk(n)
            self._wait(lambda: self.pg.allgather([list(chunks)], [buf], opts), "all_gather", buf, *chunks)
        return out.cpu()

    def broadcast_bytes(self, buf: torch.Tensor, src: int) -> None:
        self.broadcast(buf, src)

    def broadcast(self, t: torch.Tensor, src: int) -> None:
        opts = BroadcastOptions()
        opts.rootRank = src
        timeout = self._timeout()
        if timeout is not None:
            opts.timeout = timeout
        self._staged(t, lambda x: self._wait(lambda: self.pg.broadcast([x], opts), "broadcast", x))

    def allreduce(self, t: torch.Tensor, op: str) -> None:
        timeout = self._timeout()
        opts = _OPTIONS[op] if timeout is None else _options(op, timeout)
        self._staged(t, lambda x: self._wait(lambda: self.pg.allreduce([x], opts), "all_reduce", x))

    def barrier(self) -> None:
        opts = BarrierOptions()
        timeout = self._timeout()
        if timeout is not None:
            opts.timeout = timeout
        self._wait(lambda: self.pg.barrier(opts), "barrier")

    def _staged(self, t: torch.Tensor, run: Callable[[torch.Tensor], None]) -> None:
        # The input is the result even when the backend needs another device or layout.
        stage = self.stage
        if (stage is None or t.device == stage) and t.is_contiguous():
            run(t)
            return
        work = t.to(stage) if stage is not None else t
        work = work.contiguous()
        run(work)
        t.copy_(work)


@final
@attrs.frozen(eq=False, kw_only=True)
class NativeContext(DistContext):
    """A torch.distributed process group (gloo, nccl or mpi) and its topology."""

    MODEL_NAME = "native-dist"
    EXACT_SUM_PAIRS = True
    process_group: PGLike = attrs.field(repr=False)
    #: the process group's own timeout (``ctx.timeout(s)`` bounds a section without changing it)
    pg_timeout: datetime.timedelta = attrs.field(repr=False, default=DEFAULT_TIMEOUT)
    _store: Store | None = attrs.field(repr=False, default=None, alias="_store")
    _world: NativeComm = attrs.field(repr=False, alias="_world")
    #: True when this context created the default group and must destroy it on close
    _owns_default: bool = attrs.field(repr=False, default=False, alias="_owns_default")

    def _world_comm(self) -> NativeComm:
        return self._world

    def _make_comm(self, ranks: tuple[int, ...]) -> NativeComm | None:
        if self.rank not in ranks:
            return None
        if self._store is None or self.backend not in ("gloo", "nccl"):
            raise CollectiveInputError(
                f"subgroups on a {self.backend} context without a store are not supported; "
                "create the group with torch.distributed.new_group and pass it as group="
            )
        store = PrefixStore(f"idist/group/{'-'.join(map(str, ranks))}", self._store)
        grank = ranks.index(self.rank)
        pg: Any
        if self.backend == "gloo":
            pg = ProcessGroupGloo(store, grank, len(ranks), self.pg_timeout)
        else:
            pg = dist.ProcessGroupNCCL(store, grank, len(ranks), dist.ProcessGroupNCCL.Options())
        key = "g" + "-".join(map(str, ranks))
        return NativeComm(pg, ranks, grank, self._world.stage, guard=self._world.guard, key=key)

    def _native_group_comm(self, group: object) -> NativeComm | None:
        if not isinstance(group, dist.ProcessGroup):
            return super()._native_group_comm(group)  # type: ignore[return-value]
        key = (-1, id(group))
        comms = self._state.comms
        if key not in comms:
            ranks = tuple(dist.get_process_group_ranks(group))
            comms[key] = (
                NativeComm(group, ranks, ranks.index(self.rank), self._world.stage, guard=self._world.guard,
                           key=f"n{id(group)}", flat=self._world.flat)
                if self.rank in ranks else None
            )  # fmt: skip
        return comms[key]  # type: ignore[return-value]

    def _allreduce_tensor(self, t: torch.Tensor, op: str, comm: Any) -> None:
        if self.backend == "gloo" and t.dtype in _GLOO_MISSING:
            # gloo fails these mid-call ("Invalid scalar type") and the group is lost: refuse first
            raise UnsupportedValueError(
                f"gloo cannot reduce {t.dtype} tensors; reduce a torch.int32/torch.int64 copy "
                "(t.copy_(ctx.all_reduce(t.to(torch.int64), op))) instead"
            )
        if op == "AVERAGE" and self.backend != "nccl":
            comm.allreduce(t, "SUM")
            t.div_(len(comm.ranks))
            return
        comm.allreduce(t, op)

    def _broadcast_tensor(self, t: torch.Tensor, src: int, comm: Any) -> None:
        if self.backend == "gloo" and t.dtype in _GLOO_MISSING:
            # a broadcast moves bits: send them as bytes, a dtype gloo has
            work = t.contiguous()
            comm.broadcast(work.reshape(-1).view(torch.uint8), src)
            if work is not t:
                t.copy_(work)
            return
        comm.broadcast(t, src)

    def _barrier(self, comm: Any) -> None:
        if self.backend == "nccl":
            comm.allreduce(torch.zeros(1, device=self.device), "SUM")
        else:
            comm.barrier()

    def _wrap_model(self, model: torch.nn.Module, sync_bn: bool, kwargs: dict[str, Any]) -> torch.nn.Module:
        from ..training._model import wrap_ddp

        return wrap_ddp(self, model, sync_bn, kwargs)

    def _close(self) -> None:
        # let the worker threads drop finished work while the interpreter is whole (_inflight)
        for comm in (self._world, *self._state.comms.values()):
            if isinstance(comm, NativeComm):
                comm.inflight.drain()
        self._state.comms.clear()
        if self._owns_default and dist.is_initialized() and dist.group.WORLD is self.process_group:
            dist.destroy_process_group()


# ------------------------------------------------------------------ factories
def is_available(name: str) -> bool:
    if not dist.is_available():
        return False
    if name == "gloo":
        return dist.is_gloo_available()
    if name == "nccl":
        return dist.is_nccl_available() and torch.cuda.is_available()
    return dist.is_mpi_available()


def _check_available(name: str) -> None:
    if is_available(name):
        return
    if name == "nccl" and not torch.cuda.is_available():
        raise BackendUnavailableError("backend 'nccl' needs CUDA, and no CUDA device is visible; use 'gloo' on CPU")
    raise BackendUnavailableError(
        f"backend {name!r} is not built into this torch ({torch.__version__}); "
        "use 'gloo', or install a torch build with it"
    )


def _timeout(value: float | datetime.timedelta | None) -> datetime.timedelta:
    if value is None:
        return DEFAULT_TIMEOUT
    if isinstance(value, datetime.timedelta):
        return value
    return datetime.timedelta(seconds=float(value))


def _device(name: str, local_rank: int) -> torch.device:
    if name == "nccl":
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def _build(
    name: str, pg: PGLike, store: Store | None, info: LaunchInfo, timeout: datetime.timedelta,
    owns_default: bool, checked: bool | None = None,
) -> NativeContext:  # fmt: skip
    device = _device(name, info.local_rank)
    stage = device if name == "nccl" else None
    guard = Guard(
        PrefixStore("idist/guard", store) if store is not None else None,
        timeout,
        checked=checked_from_env() if checked is None else checked,
    )
    config = dict(info.decided_by)
    config["launcher"] = info.launcher
    ctx = NativeContext(
        backend=name, rank=info.rank, world_size=info.world_size, local_rank=info.local_rank,
        nproc_per_node=info.nproc_per_node, node_rank=info.node_rank, nnodes=info.nnodes,
        device=device, config=config, process_group=pg, pg_timeout=timeout, _store=store,
        _world=NativeComm(pg, tuple(range(info.world_size)), info.rank, stage, guard=guard, flat=name != "mpi"),
        _owns_default=owns_default,
    )  # fmt: skip
    ctx._state.guard = guard
    if device.type == "cuda":
        previous = torch.cuda.current_device()
        torch.cuda.set_device(device)
        ctx._state.on_close.append(lambda: torch.cuda.set_device(previous))
    return ctx


def _explicit_info(
    rank: int | None, world_size: int | None, master_addr: str | None, master_port: int | None
) -> LaunchInfo:
    if rank is None or world_size is None:
        raise LaunchEnvironmentError(f"pass both rank= and world_size= (got rank={rank}, world_size={world_size})")
    if not 0 <= rank < world_size:
        raise LaunchEnvironmentError(f"rank={rank} is outside 0..{world_size - 1}")
    decided = {"rank": "argument", "world_size": "argument", "master": f"{master_addr}:{master_port}"}
    return LaunchInfo("arguments", rank, world_size, rank, world_size, 0, 1, master_addr, master_port, decided)


def create(
    name: str,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    init_method: str | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    store: Store | None = None,
    timeout: float | datetime.timedelta | None = None,
    checked: bool | None = None,
    **unknown: Any,
) -> NativeContext:
    """Initialize the default torch.distributed group for ``name`` and wrap it.

    Topology comes from the arguments, else from the launcher's environment, else it is
    a world of one on loopback with a free port. Raises ``BackendUnavailableError``,
    ``LaunchEnvironmentError`` (partial arguments or environment) or
    ``AlreadyInitializedError`` (torch.distributed already initialized: use
    ``idist.current()`` to adopt it instead).
    """
    if unknown:
        raise TypeError(f"unknown options for backend {name!r}: {', '.join(sorted(unknown))}")
    _check_available(name)
    if dist.is_initialized():
        raise AlreadyInitializedError(
            f"torch.distributed is already initialized ({dist.get_backend()}); idist.current() "
            "adopts it, or call torch.distributed.destroy_process_group() first"
        )
    td = _timeout(timeout)
    explicit = rank is not None or world_size is not None or store is not None
    info = _explicit_info(rank, world_size, master_addr, master_port) if explicit else detect(os.environ)
    if info is None:
        if init_method is not None:
            raise LaunchEnvironmentError(f"init_method={init_method!r} needs rank= and world_size=")
        info = _explicit_info(0, 1, LOOPBACK, None)
        info = attrs.evolve(info, launcher="none", decided_by={"world": "no launcher found: one process"})
    if store is None and init_method is None:
        addr = master_addr or info.master_addr or LOOPBACK
        port = master_port if master_port is not None else info.master_port
        if port is None:
            if info.world_size > 1:
                raise LaunchEnvironmentError(
                    f"{info.launcher}: no rendezvous port for {info.world_size} ranks; "
                    "set MASTER_ADDR and MASTER_PORT (or pass master_addr=/master_port=)"
                )
            port = 0  # a free port: one process needs no peers to find it
        # Under torchrun the agent already serves the store on MASTER_PORT: every rank is a client.
        agent_store = info.launcher == "torchrun" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        store = TCPStore(addr, port, info.world_size, info.rank == 0 and not agent_store, timeout=td)
    dist.init_process_group(
        name, init_method=init_method, store=store, rank=info.rank, world_size=info.world_size, timeout=td
    )
    try:
        if store is None:
            store = dist.distributed_c10d._get_default_store()
        pg = dist.group.WORLD
        assert pg is not None
        ctx = _build(name, pg, store, info, td, owns_default=True, checked=checked)
        _CREATED.add(id(pg))
        ctx._state.on_close.append(lambda: _CREATED.discard(id(pg)))
        return ctx
    except BaseException:
        dist.destroy_process_group()
        raise


def adopt() -> NativeContext | None:
    """Wrap a process group the user initialized with torch directly (never destroyed by us)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    pg = dist.group.WORLD
    if pg is None or id(pg) in _CREATED:
        return None
    name = str(dist.get_backend(pg))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        env = detect(os.environ)
    except LaunchEnvironmentError:
        env = None
    if env is None or (env.rank, env.world_size) != (rank, world):
        env = _explicit_info(rank, world, None, None)
    env = attrs.evolve(env, launcher=f"adopted torch.distributed ({env.launcher})")
    try:
        store: Store | None = dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError):
        store = None
    return _build(
        name if name in ("gloo", "nccl", "mpi") else "gloo", pg, store, env, DEFAULT_TIMEOUT, owns_default=False
    )


def create_in_process(
    store: Store,
    rank: int,
    world_size: int,
    *,
    timeout: float | datetime.timedelta | None = None,
    checked: bool | None = None,
) -> NativeContext:
    """A gloo context over ``store`` that does not touch torch's default group.

    Several of these live in one process, one per thread, for simulated ranks.
    """
    if not 0 <= rank < world_size:
        raise LaunchEnvironmentError(f"rank={rank} is outside 0..{world_size - 1}")
    td = _timeout(timeout)
    opts = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    opts._timeout = td
    opts._devices = [ProcessGroupGloo.create_device(hostname=LOOPBACK)]  # in-process: loopback only
    pg = cast(PGLike, ProcessGroupGloo(PrefixStore("idist/world", store), rank, world_size, opts))
    info = _explicit_info(rank, world_size, None, None)
    info = attrs.evolve(info, launcher="simulated", decided_by={"world": "in-process store"})
    return _build("gloo", pg, store, info, td, owns_default=False, checked=checked)


def still_adopted(ctx: DistContext) -> bool:
    """Whether the torch group that ``ctx`` adopted is still torch's default group."""
    return dist.is_initialized() and dist.group.WORLD is getattr(ctx, "process_group", None)
