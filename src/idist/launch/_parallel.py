"""``idist.Parallel``: ignite's launcher helper, explicit about which of its two modes runs.

* **spawn mode** (``nproc_per_node``/``nprocs`` given, no launcher around us): ``run``
  spawns the ranks through ``idist.spawn``; the parent itself stays uninitialized.
* **in-place mode** (started by torchrun, mpirun, srun, horovodrun or torch_xla, or no
  process count at all): entering initializes this process (the launcher's environment
  decides, or ``backend``; with neither, serial), ``run`` calls ``fn(local_rank, ...)``
  here with that context current, and leaving finalizes it. Under torch_xla the context
  is current in the calling thread only (XLA CPU replicas are threads of one process).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import ExitStack
from types import TracebackType
from typing import Concatenate, Literal, ParamSpec, TypeVar, final, overload

import torch
from typing_extensions import Unpack

from .. import _stack
from .._backends import require
from .._context import DistContext
from .._detect import launched_by
from .._errors import LaunchConfigError
from .._log import visible_logger
from .._types import (
    BackendName,
    DrivenOptions,
    ElasticSpawnOptions,
    HorovodBackend,
    SpawnedNative,
    SpawnOptions,
    XlaBackend,
)
from . import _elastic_fn
from ._plan import LaunchPlan
from ._spawn import ignite_spawn

R = TypeVar("R")
P = ParamSpec("P")


class ParallelOptions(ElasticSpawnOptions, total=False):
    """``Parallel``'s ``**spawn_kwargs``: options for ``spawn`` (``timeout`` also initializes in place)."""

    join: bool  # run always joins: False raises LaunchConfigError (and is not in the overloads' types)


class JoinedOptions(SpawnOptions, total=False):
    """``ParallelOptions`` as the type checker sees them: ``join`` can only be True."""

    join: Literal[True]


class SpawningOptions(JoinedOptions, ElasticSpawnOptions, total=False):
    """``JoinedOptions`` with a process count: ``max_restarts`` runs the ranks on torch's elastic agent."""


class DrivenParallelOptions(DrivenOptions, total=False):
    """As ``JoinedOptions``, spawning through horovod.run or torch_xla.launch (never daemons)."""

    join: Literal[True]


def _default_spawn_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


@final
class Parallel:
    """Run a function distributed, whether or not a launcher started this process.

    ``Parallel(backend=None, nproc_per_node=None, nnodes=None, node_rank=None,
    master_addr=None, master_port=None, init_method=None, **spawn_kwargs)``, ignite's
    signature (``None`` means the default; ``master_port`` may be a string of digits;
    ``nprocs=``, ``torch.multiprocessing.spawn``'s name, for ``nproc_per_node``). ``run(fn, *args, **kwargs)``
    calls ``fn(local_rank, *args, **kwargs)`` on every rank and returns the return values
    of the ranks it ran, in local-rank order: all local ranks in spawn mode, this rank's
    alone in place. Use it as a context manager, as in ignite::

        with idist.Parallel(backend="gloo", nproc_per_node=2) as parallel:
            parallel.run(training, config)

    ``max_restarts=K`` (and ``nnodes=(MIN, MAX)``) with a process count spawns the ranks on
    torch's elastic agent: a failed rank costs one restart of ``fn`` (docs/elastic.md).

    Raises at construction: ``UnknownBackendError`` / ``BackendUnavailableError`` for a
    backend that cannot run here, ``LaunchConfigError`` for a process count under a
    launcher (the launcher already chose it), node options without a process count,
    ``init_method="tcp://..."`` with spawned ranks. ``run`` raises ``LaunchError`` when a
    spawned rank fails.
    """

    # In place (no process count) any backend; spawning, those spawn starts, with its limits.
    @overload
    def __init__(
        self,
        backend: BackendName | None = None,
        nproc_per_node: None = None,
        nnodes: None = None,
        node_rank: None = None,
        master_addr: None = None,
        master_port: None = None,
        init_method: str | None = None,
        *,
        nprocs: None = None,
        **spawn_kwargs: Unpack[JoinedOptions],
    ) -> None: ...
    @overload
    def __init__(
        self,
        backend: SpawnedNative | None = None,
        nproc_per_node: int | None = None,
        nnodes: int | tuple[int, int] | None = None,
        node_rank: int | None = None,
        master_addr: str | None = None,
        master_port: int | str | None = None,
        init_method: str | None = None,
        *,
        nprocs: int | None = None,
        **spawn_kwargs: Unpack[SpawningOptions],
    ) -> None: ...
    @overload
    def __init__(
        self,
        backend: HorovodBackend | XlaBackend,
        nproc_per_node: int | None = None,
        nnodes: Literal[1] | None = None,
        node_rank: Literal[0] | None = None,
        master_addr: None = None,
        master_port: None = None,
        init_method: None = None,
        *,
        nprocs: int | None = None,
        **spawn_kwargs: Unpack[DrivenParallelOptions],
    ) -> None: ...
    def __init__(
        self,
        backend: str | None = None,
        nproc_per_node: int | None = None,
        nnodes: int | tuple[int, int] | None = None,
        node_rank: int | None = None,
        master_addr: str | None = None,
        master_port: int | str | None = None,
        init_method: str | None = None,
        *,
        nprocs: int | None = None,
        **spawn_kwargs: Unpack[ParallelOptions],
    ) -> None:
        if nprocs is not None and nproc_per_node is not None and nprocs != nproc_per_node:
            raise LaunchConfigError(f"nprocs={nprocs} and nproc_per_node={nproc_per_node} disagree; pass one of them")
        n = nproc_per_node if nproc_per_node is not None else nprocs
        if backend is not None:
            require(backend)
        self.launcher = launched_by()
        if n is not None and self.launcher is not None:
            # idist run and idist.spawn set torchrun's variables: name them, not torchrun
            who = os.environ.get("IDIST_LAUNCHER", self.launcher) if self.launcher == "torchrun" else self.launcher
            raise LaunchConfigError(
                f"this process was started by {who}, which already chose the processes; "
                f"drop nproc_per_node={n} (and the node options) or run the script without the launcher"
            )
        restarts = spawn_kwargs.get("max_restarts")
        given = {"nnodes": nnodes, "node_rank": node_rank, "master_addr": master_addr, "master_port": master_port}
        passed = ", ".join(f"{k}={v!r}" for k, v in {**given, "max_restarts": restarts}.items() if v is not None)
        if n is None and passed:
            raise LaunchConfigError(f"{passed} describe processes to spawn: pass nproc_per_node= too")
        unknown = set(spawn_kwargs) - {"join", "daemon", "start_method", "timeout", "max_restarts"}
        if unknown:
            raise LaunchConfigError(
                f"unknown Parallel options: {', '.join(sorted(unknown))}; "
                "spawn options are join, daemon, start_method, timeout and max_restarts"
            )
        if spawn_kwargs.get("join") is False:
            raise LaunchConfigError("Parallel.run always joins; use idist.spawn(..., join=False) for a handle")
        self.backend = backend
        self.init_method = init_method
        self.spawn_kwargs = spawn_kwargs
        #: the node arguments of an elastic launch (``max_restarts``, ``nnodes=(MIN, MAX)``), checked here
        self._elastic: tuple[int | tuple[int, int] | None, int, str | None, int | str | None] | None = None
        if n is not None and _elastic_fn.wanted(nnodes, restarts):
            _elastic_fn.check_backend(self._spawn_backend())
            daemon, method = spawn_kwargs.get("daemon", False), spawn_kwargs.get("start_method", "spawn")
            node = (nnodes, node_rank, master_addr, master_port)
            _elastic_fn.elastic_plan(n, *node, restarts, init_method=init_method, daemon=daemon, start_method=method)
            self._elastic = (nnodes, 0, master_addr, master_port)  # node_rank 0: ignite's default, not a node
            nnodes = node_rank = master_addr = master_port = None
        self.plan = (
            LaunchPlan.from_arguments(n, nnodes, node_rank, master_addr, master_port, init_method)
            if n is not None
            else None
        )
        self._ctx: DistContext | None = None
        self._scope: ExitStack | None = None
        self._log = visible_logger("idist.launch")

    @property
    def spawns(self) -> bool:
        """True in spawn mode: ``run`` starts new processes."""
        return self.plan is not None

    @property
    def nproc_per_node(self) -> int | None:
        return None if self.plan is None else self.plan.nproc_per_node

    def __enter__(self) -> Parallel:
        if self.plan is not None:
            p = self.plan
            params = {
                "nproc_per_node": p.nproc_per_node,
                "nnodes": p.nnodes,
                "node_rank": p.node_rank,
                "master_addr": p.master_addr,
                "master_port": p.master_port,
            }
            shown = "".join(f"\n\t{k}: {v}" for k, v in params.items() if v is not None)
            self._log.info("Initialized distributed launcher with backend: %r", self._spawn_backend())
            self._log.info("- Parameters to spawn processes: %s", shown)
        elif self._ctx is None:
            self._initialize()
        return self

    def _initialize(self) -> DistContext:
        kwargs: dict[str, object] = {}
        if self.init_method is not None:
            kwargs["init_method"] = self.init_method
        timeout = self.spawn_kwargs.get("timeout")
        if timeout is not None:
            kwargs["timeout"] = timeout
        if self.launcher == "torch_xla":
            # XLA device threads share this process: each gets its own current context.
            scope = ExitStack()
            ctx = scope.enter_context(_stack.scoped(self.backend, **kwargs))
            self._scope = scope
        else:
            ctx = _stack.initialize(self.backend, **kwargs)
        self._ctx = ctx
        if self.backend is not None:
            self._log.info("Initialized processing group with backend: %r", ctx.backend, extra={"idist_rank": ctx.rank})
        return ctx

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        ctx, self._ctx = self._ctx, None
        scope, self._scope = self._scope, None
        if scope is not None:
            scope.close()
        elif ctx is not None:
            _stack.finalize()
        if ctx is not None and self.backend is not None:
            self._log.info("Finalized processing group with backend: %r", ctx.backend, extra={"idist_rank": ctx.rank})

    def _spawn_backend(self) -> str:
        return self.backend or _default_spawn_backend()

    def run(self, fn: Callable[Concatenate[int, P], R], *args: P.args, **kwargs: P.kwargs) -> list[R]:
        """``fn(local_rank, *args, **kwargs)`` on every rank (checked against ``fn``'s parameters); see the
        class docstring."""
        p = self.plan
        if p is not None:
            self._log.info("Spawn function %r in %d processes", fn, p.nproc_per_node)
            node = (p.nnodes, p.node_rank, p.master_addr, p.master_port) if self._elastic is None else self._elastic
            results = ignite_spawn(
                self._spawn_backend(), fn, args, kwargs, p.nproc_per_node, *node, self.init_method, **self.spawn_kwargs
            )
            assert isinstance(results, list)  # Parallel always joins
            self._log.info("End of run")
            return results
        if self._ctx is not None:
            return self._run_here(self._ctx, fn, args, kwargs)
        with self:
            assert self._ctx is not None
            return self._run_here(self._ctx, fn, args, kwargs)

    def _run_here(
        self, ctx: DistContext, fn: Callable[..., R], args: tuple[object, ...], kwargs: dict[str, object]
    ) -> list[R]:
        self._log.info("- Run %r in %d processes", fn, ctx.world_size, extra={"idist_rank": ctx.rank})
        result = fn(ctx.local_rank, *args, **kwargs)
        self._log.info("End of run", extra={"idist_rank": ctx.rank})
        return [result]

    def __repr__(self) -> str:
        p = self.plan
        mode = f"spawn {p.nproc_per_node} x {p.nnodes} node(s)" if p is not None else "in place"
        return f"Parallel(backend={self.backend!r}, {mode}, launcher={self.launcher})"
