"""Making a ``NativeContext``: from arguments or the launcher's environment, or in-process
for simulated ranks (adopting a group the user initialized: ``_adopt``)."""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

import attrs
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, Store

from ... import _liveness_limit, _marks
from ..._core import ContextState
from ..._errors import AlreadyInitializedError, BackendUnavailableError, LaunchEnvironmentError
from ..._launch_env import LaunchInfo, detect
from ..._topology import Topology
from . import _rendezvous
from ._comm import SLICES_PER_LOOK, NativeComm
from ._guard import Guard, checked_from_env
from ._inflight import InFlight, Unheld
from ._keys import built, farewell, namespace, serving_node
from ._liveness import heartbeat
from ._pg import PGLike

if TYPE_CHECKING:
    from ._context import NativeContext

C = TypeVar("C", bound="NativeContext")

DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)
LOOPBACK = "127.0.0.1"

#: makes group rank ``r``'s process group of the global ``ranks`` (an in-process transport's)
GroupMaker = Callable[[tuple[int, ...], int], PGLike]
#: ids of the default groups that an idist context created: those are never "adopted"
#: by another thread's current(), which must not see a context scoped elsewhere.
CREATED: set[int] = set()


def is_available(name: str) -> bool:
    if not dist.is_available():
        return False
    if name == "gloo":
        return dist.is_gloo_available()
    if name == "nccl":
        return dist.is_nccl_available() and torch.cuda.is_available()
    return dist.is_mpi_available()


def unavailable_reason(name: str) -> str:
    if name == "nccl" and not torch.cuda.is_available():
        return "backend 'nccl' needs CUDA, and no CUDA device is visible; use 'gloo' on CPU"
    return (
        f"backend {name!r} is not built into this torch ({torch.__version__}); "
        "use 'gloo', or install a torch build with it"
    )


def _check_available(name: str) -> None:
    if not is_available(name):
        raise BackendUnavailableError(unavailable_reason(name))


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
    cls: type[C],
    name: str,
    pg: PGLike,
    store: Store | None,
    info: LaunchInfo,
    timeout: datetime.timedelta,
    owns_default: bool,
    checked: bool | None = None,
    bind: str | None = None,
    liveness: float = 0.0,
    groups: GroupMaker | None = None,
    store_node: int | None = None,
) -> C:
    """The context over ``pg``; ``liveness`` is the limit in seconds of its heartbeat (0: none);
    ``groups`` makes its subgroups' process groups (None: gloo over ``store``); ``store_node`` the
    node that serves ``store``, when known (else the heartbeat finds it)."""
    t = info.topology
    ns = namespace(store, t.rank, os.environ) if store is not None else "idist"
    beat = heartbeat(store, info, liveness, prefix=f"{ns}/live", store_node=store_node)
    device = _device(name, info.topology.local_rank)
    nproc = t.nproc_per_node
    guard = Guard(
        PrefixStore(f"{ns}/guard", store) if store is not None else None,
        timeout,
        checked=checked_from_env() if checked is None else checked,
        store_host_ranks=tuple(range(store_node * nproc, (store_node + 1) * nproc)) if store_node is not None else (),
        nproc_per_node=nproc if t.nnodes > 1 else 0,
        liveness=beat,
        marks=_marks.claimed(os.environ, t.rank),
        namespace=ns,
    )
    # gloo's waits are cut into slices (NativeComm._finish asks the watcher and the guard between
    # two); alone, a rank has no peer to wait for, and an in-process transport's calls wait inside
    interval = beat.interval if beat is not None else 1.0
    sliceable = name == "gloo" and t.world_size > 1 and groups is None
    sliced = datetime.timedelta(seconds=interval / SLICES_PER_LOOK) if sliceable else None
    world = NativeComm(
        pg,
        tuple(range(t.world_size)),
        t.rank,
        guard,
        stage=device if name == "nccl" else None,
        flat=name != "mpi",
        default_group=owns_default,
        slice=sliced,
        inflight=InFlight() if groups is None else Unheld(),
    )
    state = ContextState(world)
    ctx = cls(
        backend=name,
        topology=t,
        device=device,
        config={**info.decided_by, "launcher": info.launcher},
        pg_timeout=timeout,
        bind_address=bind,
        _store=store,
        _owns_default=owns_default,
        _groups=groups,
        _state=state,
    )
    if store is not None:  # runs last (on_close is a stack): the last rank to close deletes the keys
        state.on_close.append(lambda: farewell(store, ns, t.world_size, guard.written, beat))
    if beat is not None:
        beat.start()
        state.on_close.append(beat.stop)
    if device.type == "cuda":
        previous = torch.cuda.current_device()
        torch.cuda.set_device(device)
        state.on_close.append(lambda: torch.cuda.set_device(previous))
    return ctx


def _explicit_info(
    rank: int | None, world_size: int | None, master_addr: str | None, master_port: int | None
) -> LaunchInfo:
    if rank is None or world_size is None:
        raise LaunchEnvironmentError(f"pass both rank= and world_size= (got rank={rank}, world_size={world_size})")
    if not 0 <= rank < world_size:
        raise LaunchEnvironmentError(f"rank={rank} is outside 0..{world_size - 1}")
    decided = {"rank": "argument", "world_size": "argument", "master": f"{master_addr}:{master_port}"}
    return LaunchInfo(
        launcher="arguments",
        topology=Topology.flat(rank, world_size),
        master_addr=master_addr,
        master_port=master_port,
        decided_by=decided,
    )


def create(
    cls: type[C],
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
    liveness: float | None = None,
    **unknown: object,
) -> C:
    """Initialize the default torch.distributed group for ``name`` and wrap it.

    Topology comes from the arguments, else from the launcher's environment, else it is a world
    of one on loopback with a free port. ``liveness`` is the seconds of silence after which a peer
    is lost (default ``IDIST_LIVENESS``, else 30; 0 turns it off). Raises ``BackendUnavailableError``,
    ``LaunchEnvironmentError`` (partial arguments or environment) or ``AlreadyInitializedError``
    (torch.distributed already initialized: use ``idist.current()`` to adopt it instead).
    """
    if unknown:
        raise TypeError(f"unknown options for backend {name!r}: {', '.join(sorted(unknown))}")
    limit = _liveness_limit.limit_from(liveness, os.environ)
    _check_available(name)
    if dist.is_initialized():
        raise AlreadyInitializedError(
            f"torch.distributed is already initialized ({dist.get_backend()}); idist.current() "
            "adopts it, or call torch.distributed.destroy_process_group() first"
        )
    td = _timeout(timeout)
    store_node: int | None = None
    explicit = rank is not None or world_size is not None or store is not None
    # an init_method other than env:// is the rendezvous itself: MASTER_* are not needed
    own_rendezvous = init_method is not None and not init_method.startswith("env://")
    info: LaunchInfo | None = (
        _explicit_info(rank, world_size, master_addr, master_port)
        if explicit
        else detect(os.environ, need_master=not own_rendezvous)
    )
    if info is None:
        info = _explicit_info(0, 1, LOOPBACK, None)
        info = attrs.evolve(info, launcher="none", decided_by={"world": "no launcher found: one process"})
    if init_method is not None:
        info = attrs.evolve(info, decided_by={**info.decided_by, "master": f"init_method={init_method}"})
    world = info.topology.world_size
    bind = _rendezvous.bind_for(info, master_addr or info.master_addr)
    info = _rendezvous.noted(info, bind)
    if store is None and init_method is None:
        addr = master_addr or info.master_addr or LOOPBACK
        port = master_port if master_port is not None else info.master_port
        if port is None:
            if world > 1:
                raise LaunchEnvironmentError(
                    f"{info.launcher}: no rendezvous port for {world} ranks; "
                    "set MASTER_ADDR and MASTER_PORT (or pass master_addr=/master_port=)"
                )
            port = 0  # a free port: one process needs no peers to find it
        # Under torchrun the agent already serves the store on MASTER_PORT: every rank is a client.
        agent_store = info.launcher == "torchrun" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        store = _rendezvous.tcp_store(addr, port, info, info.topology.rank == 0 and not agent_store, td)
        if agent_store:  # the agent's store outlives a restart: each attempt keeps its keys apart (as torch does)
            store = PrefixStore(f"/worker/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
        else:
            store_node = 0  # rank 0 serves it
            if world > 1:
                _rendezvous.join(store, info, td, f"{addr}:{port}")
    with _rendezvous.gloo_interface(bind):
        dist.init_process_group(
            name, init_method=init_method, store=store, rank=info.topology.rank, world_size=world, timeout=td
        )
    try:
        if store is None:
            store = dist.distributed_c10d._get_default_store()
        pg = dist.group.WORLD
        assert pg is not None
        if store_node is None and limit > 0 and info.topology.nnodes > 1:
            store_node = serving_node(store, info.topology.node_rank, _device(name, info.topology.local_rank))
        ctx = _build(
            cls,
            name,
            pg,
            store,
            info,
            td,
            owns_default=True,
            checked=checked,
            bind=bind.address,
            liveness=limit,
            store_node=store_node,
        )
        key = id(pg)  # not pg itself: a broken context drops its last reference (closing its sockets)
        CREATED.add(key)
        ctx._state.on_close.append(lambda: CREATED.discard(key))
        return ctx
    except BaseException:
        dist.destroy_process_group()
        raise


def create_in_process(
    cls: type[C],
    store: Store,
    rank: int,
    world_size: int,
    timeout: float | datetime.timedelta | None,
    checked: bool | None,
    groups: GroupMaker | None = None,
) -> C:
    """A gloo context over ``store`` that does not touch torch's default group (see NativeContext);
    with ``groups``, its process groups (the world's and every subgroup's) come from there."""
    if not 0 <= rank < world_size:
        raise LaunchEnvironmentError(f"rank={rank} is outside 0..{world_size - 1}")
    td = _timeout(timeout)
    pg: PGLike
    if groups is not None:
        pg = groups(tuple(range(world_size)), rank)
    else:
        opts = ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # private in torch's stubs
        opts._timeout = td
        opts._devices = [ProcessGroupGloo.create_device(hostname=LOOPBACK)]  # in-process: loopback only
        rendezvous = PrefixStore("idist/world", store)
        pg = cast(PGLike, ProcessGroupGloo(rendezvous, rank, world_size, opts))
        built(rendezvous, world_size)  # its rendezvous keys: deleted once every rank connected
    info = _explicit_info(rank, world_size, None, None)
    info = attrs.evolve(info, launcher="simulated", decided_by={"world": "in-process store"})
    return _build(cls, "gloo", pg, store, info, td, owns_default=False, checked=checked, bind=LOOPBACK, groups=groups)
