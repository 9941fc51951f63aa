"""``idist.spawn``: ``torch.multiprocessing.spawn``'s signature and ignite's, one implementation (``_procs``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal, TypeVar, cast, overload

from typing_extensions import TypeVarTuple, Unpack

from .._errors import LaunchConfigError
from .._types import (
    DrivenOptions,
    ElasticNodeOptions,
    ElasticSpawnOptions,
    HorovodBackend,
    NodeOptions,
    SpawnedNative,
    SpawnOptions,
    XlaBackend,
)
from . import _elastic_fn
from ._driven import Job, check_options
from ._driven import run as run_driven
from ._handle import SpawnHandle
from ._plan import DRIVEN_SPAWNABLE, LaunchPlan, StartMethod, checked_args, normalize_backend
from ._procs import start

R = TypeVar("R")
Ts = TypeVarTuple("Ts")


# torch.multiprocessing's form: spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn").
# ``fn`` is called as ``fn(local_rank, *args)``, so its parameters are checked against ``args``.
@overload
def spawn(
    fn: Callable[[int, *Ts], R],
    args: tuple[*Ts] = ...,
    nprocs: int = 1,
    join: Literal[True] = True,
    daemon: bool = False,
    start_method: StartMethod = "spawn",
    **node: Unpack[ElasticNodeOptions],
) -> list[R]: ...
@overload
def spawn(
    fn: Callable[[int, *Ts], R],
    args: tuple[*Ts],
    nprocs: int,
    join: Literal[False],
    daemon: bool = False,
    start_method: StartMethod = "spawn",
    **node: Unpack[NodeOptions],
) -> SpawnHandle[R]: ...
@overload
def spawn(
    fn: Callable[[int, *Ts], R],
    args: tuple[*Ts] = ...,
    nprocs: int = 1,
    *,
    join: Literal[False],
    daemon: bool = False,
    start_method: StartMethod = "spawn",
    **node: Unpack[NodeOptions],
) -> SpawnHandle[R]: ...
# ignite's form: spawn(backend, fn, args, kwargs_dict=None, nproc_per_node=1, ...), ``fn(local_rank, *args,
# **kwargs_dict)``: checked against ``args`` without kwargs_dict. mpi is started by mpirun, not spawned;
# horovod.run and torch_xla.launch join always, on one node, at a rendezvous of their own.
@overload
def spawn(
    backend: SpawnedNative,
    fn: Callable[[int, *Ts], R],
    args: tuple[*Ts] = ...,
    kwargs_dict: None = None,
    nproc_per_node: int = 1,
    nnodes: int | tuple[int, int] | None = 1,
    node_rank: int | None = 0,
    master_addr: str | None = None,
    master_port: int | str | None = None,
    init_method: str | None = None,
    *,
    join: Literal[True] = True,
    **options: Unpack[ElasticSpawnOptions],
) -> list[R]: ...
@overload
def spawn(
    backend: SpawnedNative,
    fn: Callable[[int, *Ts], R],
    args: tuple[*Ts] = ...,
    kwargs_dict: None = None,
    nproc_per_node: int = 1,
    nnodes: int | None = 1,
    node_rank: int | None = 0,
    master_addr: str | None = None,
    master_port: int | str | None = None,
    init_method: str | None = None,
    *,
    join: Literal[False],
    **options: Unpack[SpawnOptions],
) -> SpawnHandle[R]: ...
@overload
def spawn(
    backend: SpawnedNative,
    fn: Callable[..., R],
    args: tuple[object, ...],
    kwargs_dict: Mapping[str, object],
    nproc_per_node: int = 1,
    nnodes: int | tuple[int, int] | None = 1,
    node_rank: int | None = 0,
    master_addr: str | None = None,
    master_port: int | str | None = None,
    init_method: str | None = None,
    *,
    join: Literal[True] = True,
    **options: Unpack[ElasticSpawnOptions],
) -> list[R]: ...
@overload
def spawn(
    backend: SpawnedNative,
    fn: Callable[..., R],
    args: tuple[object, ...],
    kwargs_dict: Mapping[str, object],
    nproc_per_node: int = 1,
    nnodes: int | None = 1,
    node_rank: int | None = 0,
    master_addr: str | None = None,
    master_port: int | str | None = None,
    init_method: str | None = None,
    *,
    join: Literal[False],
    **options: Unpack[SpawnOptions],
) -> SpawnHandle[R]: ...
@overload
def spawn(
    backend: HorovodBackend | XlaBackend,
    fn: Callable[[int, *Ts], R],
    args: tuple[*Ts] = ...,
    kwargs_dict: None = None,
    nproc_per_node: int = 1,
    nnodes: Literal[1] | None = 1,
    node_rank: Literal[0] | None = 0,
    master_addr: None = None,
    master_port: None = None,
    init_method: None = None,
    *,
    join: Literal[True] = True,
    **options: Unpack[DrivenOptions],
) -> list[R]: ...
@overload
def spawn(
    backend: HorovodBackend | XlaBackend,
    fn: Callable[..., R],
    args: tuple[object, ...],
    kwargs_dict: Mapping[str, object],
    nproc_per_node: int = 1,
    nnodes: Literal[1] | None = 1,
    node_rank: Literal[0] | None = 0,
    master_addr: None = None,
    master_port: None = None,
    init_method: None = None,
    *,
    join: Literal[True] = True,
    **options: Unpack[DrivenOptions],
) -> list[R]: ...
def spawn(*args: object, **kwargs: object) -> object:
    """Run ``fn`` in ``nprocs`` new processes, one per local rank.

    ``torch.multiprocessing.spawn``'s form, ``spawn(fn, args=(), nprocs=1, join=True,
    daemon=False, start_method="spawn")``: each process calls ``fn(local_rank, *args)`` with
    RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, NNODES, MASTER_ADDR and
    MASTER_PORT set, so a plain ``idist.initialize()`` inside ``fn`` joins the world.
    Keyword-only ``nnodes``, ``node_rank``, ``master_addr`` and ``master_port`` make this
    launch one node of a larger world (every node passes the same master address/port).

    ignite's form, ``spawn(backend, fn, args, kwargs_dict=None, nproc_per_node=1,
    nnodes=1, node_rank=0, master_addr=None, master_port=None, init_method=None)``:
    each process also initializes ``backend`` before ``fn(local_rank, *args,
    **kwargs_dict)`` and finalizes it after. ``backend="horovod"`` starts the ranks
    with ``horovod.run`` and ``backend="xla-tpu"`` with ``torch_xla.launch`` (XLA replicas:
    on the XLA CPU device, threads of one process), each from a launcher process of its
    own; both join always and run on one node (``LaunchConfigError`` otherwise). A backend
    name first (or ``backend=``) selects this form.

    The rendezvous port is a free one reserved by this process until the launch ends
    (no fixed default, so two launches at once never collide); the address defaults to
    loopback. ``join=True`` waits and returns each rank's return value in local-rank
    order; ``join=False`` returns a ``SpawnHandle`` to ``join()`` or ``terminate()``.

    ``max_restarts=K`` or ``nnodes=(MIN, MAX)`` (joined launches of native backends) run the
    ranks on torch's elastic agent, as ``idist run --max-restarts`` does: a failed rank costs
    one restart of ``fn``, up to K (docs/elastic.md).

    Raises ``LaunchError`` as soon as any rank raises, exits non-zero or is killed, with
    the rank, its exit code or signal and its traceback, after stopping the other ranks.
    Ctrl-C stops every rank. ``LaunchConfigError`` (a ``ValueError``) for arguments that
    cannot work.
    """
    # The overloads above type each form; each form's function checks its own arguments.
    first = args[0] if args else kwargs.get("backend", kwargs.get("fn"))
    form: Callable[..., object] = ignite_spawn if isinstance(first, str) or "backend" in kwargs else torch_mp_spawn
    return form(*args, **kwargs)


def torch_mp_spawn(
    fn: Callable[..., R],
    args: tuple[object, ...] = (),
    nprocs: int | None = None,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
    *,
    nnodes: int | tuple[int, int] = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
    nproc_per_node: int | None = None,
    max_restarts: int | None = None,
) -> list[R] | SpawnHandle[R]:
    """``spawn`` in ``torch.multiprocessing.spawn``'s form (``nproc_per_node=`` as ignite names ``nprocs``)."""
    if nprocs is not None and nproc_per_node is not None and nprocs != nproc_per_node:
        raise LaunchConfigError(f"nprocs={nprocs} and nproc_per_node={nproc_per_node} disagree; pass one of them")
    n = nprocs if nprocs is not None else nproc_per_node if nproc_per_node is not None else 1
    if _elastic_fn.wanted(nnodes, max_restarts):
        node = (nnodes, None if node_rank == 0 else node_rank, master_addr, master_port)  # 0: the default
        joined = _elastic_fn.launch(
            fn, args, {}, n, node, max_restarts, join=join, daemon=daemon, start_method=start_method
        )
        return cast("list[R]", joined)
    plan = LaunchPlan.from_arguments(n, nnodes, node_rank, master_addr, master_port)
    handle: SpawnHandle[R] = start(fn, args, {}, plan, daemon=daemon, start_method=start_method, join=join)
    return _finish(handle, join)


def ignite_spawn(
    backend: str,
    fn: Callable[..., R],
    args: tuple[object, ...] = (),
    kwargs_dict: Mapping[str, object] | None = None,
    nproc_per_node: int = 1,
    nnodes: int | tuple[int, int] | None = 1,
    node_rank: int | None = 0,
    master_addr: str | None = None,
    master_port: int | str | None = None,
    init_method: str | None = None,
    *,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
    timeout: float | None = None,
    nprocs: int | None = None,
    max_restarts: int | None = None,
) -> list[R] | SpawnHandle[R]:
    if nprocs is not None:
        if nproc_per_node not in (1, nprocs):
            raise LaunchConfigError(f"nprocs={nprocs} and nproc_per_node={nproc_per_node} disagree; pass one of them")
        nproc_per_node = nprocs
    if kwargs_dict is not None and not isinstance(kwargs_dict, Mapping):
        raise LaunchConfigError(f"kwargs_dict must be a mapping of keyword arguments for fn, got {kwargs_dict!r}")
    name = normalize_backend(backend)
    init: dict[str, object] = {}
    if timeout is not None:
        init["timeout"] = timeout
    if _elastic_fn.wanted(nnodes, max_restarts):
        node = (nnodes, None if node_rank == 0 else node_rank, master_addr, master_port)  # 0: ignite's default
        opts = {"init_method": init_method, "join": join, "daemon": daemon, "start_method": start_method}
        joined = _elastic_fn.launch(fn, args, kwargs_dict or {}, nproc_per_node, node, max_restarts, name, init, **opts)
        return cast("list[R]", joined)
    if init_method is not None:
        init["init_method"] = init_method
    if name in DRIVEN_SPAWNABLE:
        # the backend's launcher chooses the rendezvous: check_options refuses an init_method
        plan = LaunchPlan.from_arguments(nproc_per_node, nnodes, node_rank, master_addr, master_port)
        check_options(name, plan, join=join, daemon=daemon, init_method=init_method, start_method=start_method)
        job = Job(
            backend=name,
            fn=fn,
            args=checked_args(fn, args),
            kwargs=dict(kwargs_dict or {}),
            init_kwargs=init,
            nproc=nproc_per_node,
            start_method=start_method,
        )
        return cast("list[R]", run_driven(job))  # fn's return values, back through the reports
    plan = LaunchPlan.from_arguments(nproc_per_node, nnodes, node_rank, master_addr, master_port, init_method)
    handle = start(
        fn,
        args,
        dict(kwargs_dict or {}),
        plan,
        daemon=daemon,
        start_method=start_method,
        backend=name,
        init_kwargs=init,
        join=join,
    )
    return _finish(handle, join)


def _finish(handle: SpawnHandle[R], join: bool) -> list[R] | SpawnHandle[R]:
    return handle.results if join else handle  # joined already, inside ``start``
