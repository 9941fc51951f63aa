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

from collections.abc import Callable
from contextlib import ExitStack
from types import TracebackType
from typing import Any, TypeVar, final

import torch

from .. import _stack
from .._context import DistContext
from .._detect import launched_by
from .._errors import LaunchConfigError
from ._plan import LaunchPlan
from ._spawn import ignite_spawn

R = TypeVar("R")


def _default_spawn_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


@final
class Parallel:
    """Run a function distributed, whether or not a launcher started this process.

    ``Parallel(backend=None, nproc_per_node=None, nnodes=1, node_rank=0,
    master_addr=None, master_port=None, init_method=None, **spawn_kwargs)``
    (``nprocs=`` is the seed's name for ``nproc_per_node``). ``run(fn, *args,
    **kwargs)`` calls ``fn(local_rank, *args, **kwargs)`` on every rank and returns the
    return values of the ranks it ran, in local-rank order: all local ranks in spawn
    mode, this rank's alone in place. Use it as a context manager, as in ignite::

        with idist.Parallel(backend="gloo", nproc_per_node=2) as parallel:
            parallel.run(training, config)

    Raises ``LaunchConfigError`` for a process count under a launcher (the launcher
    already chose it) or node options without a process count; ``LaunchError`` from
    ``run`` when a spawned rank fails.
    """

    def __init__(
        self,
        backend: str | None = None,
        nproc_per_node: int | None = None,
        nnodes: int = 1,
        node_rank: int = 0,
        master_addr: str | None = None,
        master_port: int | None = None,
        init_method: str | None = None,
        *,
        nprocs: int | None = None,
        **spawn_kwargs: Any,
    ) -> None:
        if nprocs is not None and nproc_per_node is not None and nprocs != nproc_per_node:
            raise LaunchConfigError(f"nprocs={nprocs} and nproc_per_node={nproc_per_node} disagree; pass one of them")
        n = nproc_per_node if nproc_per_node is not None else nprocs
        self.launcher = launched_by()
        if n is not None and self.launcher is not None:
            raise LaunchConfigError(
                f"this process was started by {self.launcher}, which already chose the processes; "
                f"drop nproc_per_node={n} (and the node options) or run the script without the launcher"
            )
        if n is None and (nnodes != 1 or node_rank != 0 or master_addr is not None or master_port is not None):
            raise LaunchConfigError(
                "nnodes/node_rank/master_addr/master_port describe processes to spawn: pass nproc_per_node= too"
            )
        unknown = set(spawn_kwargs) - {"join", "daemon", "start_method", "timeout"}
        if unknown:
            raise LaunchConfigError(
                f"unknown Parallel options: {', '.join(sorted(unknown))}; "
                "spawn options are join, daemon, start_method and timeout"
            )
        if spawn_kwargs.get("join") is False:
            raise LaunchConfigError("Parallel.run always joins; use idist.spawn(..., join=False) for a handle")
        self.backend = backend
        self.nproc_per_node = n
        self.init_method = init_method
        self.spawn_kwargs = spawn_kwargs
        if n is not None:
            LaunchPlan(
                nproc_per_node=n, nnodes=nnodes, node_rank=node_rank, master_addr=master_addr, master_port=master_port
            ).check()
        self.nnodes, self.node_rank = nnodes, node_rank
        self.master_addr, self.master_port = master_addr, master_port
        self._ctx: DistContext | None = None
        self._scope: ExitStack | None = None

    @property
    def spawns(self) -> bool:
        """True in spawn mode: ``run`` starts new processes."""
        return self.nproc_per_node is not None

    def __enter__(self) -> Parallel:
        if not self.spawns and self._ctx is None:
            kwargs: dict[str, Any] = {}
            if self.init_method is not None:
                kwargs["init_method"] = self.init_method
            timeout = self.spawn_kwargs.get("timeout")
            if timeout is not None:
                kwargs["timeout"] = timeout
            if self.launcher == "torch_xla":
                # XLA device threads share this process: each gets its own current context.
                scope = ExitStack()
                self._ctx = scope.enter_context(_stack.scoped(self.backend, **kwargs))
                self._scope = scope
            else:
                self._ctx = _stack.initialize(self.backend, **kwargs)
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        ctx, self._ctx = self._ctx, None
        scope, self._scope = self._scope, None
        if scope is not None:
            scope.close()
        elif ctx is not None:
            _stack.finalize()

    def run(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> list[R]:
        """``fn(local_rank, *args, **kwargs)`` on every rank; see the class docstring."""
        if self.spawns:
            assert self.nproc_per_node is not None
            results: list[R] = ignite_spawn(
                self.backend or _default_spawn_backend(),
                fn,
                args,
                kwargs,
                self.nproc_per_node,
                self.nnodes,
                self.node_rank,
                self.master_addr,
                self.master_port,
                self.init_method,
                **self.spawn_kwargs,
            )
            return results
        if self._ctx is not None:
            return [fn(self._ctx.local_rank, *args, **kwargs)]
        with self:
            assert self._ctx is not None
            return [fn(self._ctx.local_rank, *args, **kwargs)]

    def __repr__(self) -> str:
        mode = f"spawn {self.nproc_per_node} x {self.nnodes} node(s)" if self.spawns else "in place"
        return f"Parallel(backend={self.backend!r}, {mode}, launcher={self.launcher})"
