"""``spawn``/``Parallel`` with ``max_restarts=`` or ``nnodes=(MIN, MAX)``: a function on torch's elastic agent.

The agent and c10d rendezvous of ``idist run --max-restarts`` (``_elastic``, ``_agent``); each rank
calls ``fn(local_rank, *args, **kwargs)`` (inside ``backend``'s context in ignite's form). A rank
that fails stops this node's ranks; the agents meet again and call ``fn`` again, at most
``max_restarts`` times. The launch returns this node's return values of the attempt that ended
well, in local-rank order, or raises ``LaunchError`` listing every failure.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from typing import Any

from .. import _stack
from .._errors import LaunchConfigError, LaunchError
from . import _elastic
from ._plan import DRIVEN_SPAWNABLE, checked_args, port_number


def wanted(nnodes: object, max_restarts: object) -> bool:
    """True when the arguments ask for an elastic launch."""
    return isinstance(nnodes, tuple) or max_restarts is not None


def check_backend(backend: str) -> None:
    """``LaunchConfigError`` for a backend whose ranks another launcher starts."""
    if backend in DRIVEN_SPAWNABLE:
        raise LaunchConfigError(
            f"max_restarts= and nnodes=(MIN, MAX) run on torch's elastic agent, not with backend={backend!r} "
            "(horovod has an elastic mode of its own); drop them or use a native backend (gloo, nccl)"
        )


def _refuse(what: str, why: str) -> LaunchConfigError:
    return LaunchConfigError(
        f"{what} cannot be elastic (max_restarts= or nnodes=(MIN, MAX)): {why}; drop {what.split('=')[0]}"
    )


def elastic_plan(
    nproc: object,
    nnodes: object,
    node_rank: object,
    master_addr: str | None,
    master_port: object,
    max_restarts: object,
    *,
    init_method: str | None = None,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
) -> _elastic.ElasticPlan:
    """The elastic launch the arguments describe; ``LaunchConfigError`` (naming the argument) otherwise."""
    if not join:
        raise _refuse("join=False", "the agent restarts the ranks until the job ends, so the launch joins")
    if node_rank is not None:
        raise _refuse(f"node_rank={node_rank!r}", "the rendezvous numbers the nodes")
    if init_method is not None:
        raise _refuse(f"init_method={init_method!r}", "the agent gives each attempt's ranks their MASTER_ADDR")
    if start_method != "spawn":
        raise _refuse(f"start_method={start_method!r}", "torch's elastic agent starts the ranks with 'spawn'")
    if daemon:
        raise _refuse("daemon=True", "the agent, not multiprocessing, owns the ranks")
    if not isinstance(max_restarts, int | None) or isinstance(max_restarts, bool):
        raise LaunchConfigError(f"max_restarts must be an int (restarts after a failure), got {max_restarts!r}")
    if max_restarts is not None and max_restarts < 0:
        raise LaunchConfigError(f"max_restarts must be 0 or more (restarts after a failure), got {max_restarts}")
    low, high = _node_range(nnodes)
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise LaunchConfigError(f"nproc_per_node must be an int of at least 1, got {nproc!r}")
    port = port_number(master_port)
    if port is None and high > 1:
        raise LaunchConfigError(
            f"nnodes={nnodes!r}: pass the same rendezvous endpoint to every node: master_addr= and "
            "master_port= (the node that owns that address hosts it)"
        )
    return _elastic.plan((low, high), nproc, max_restarts, master_addr, port, None)


def _node_range(nnodes: object) -> tuple[int, int]:
    if nnodes is None:
        return 1, 1
    pair = nnodes if isinstance(nnodes, tuple) else (nnodes, nnodes)
    if len(pair) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) for n in pair):
        raise LaunchConfigError(f"nnodes takes an int or a pair of ints (MIN, MAX), got {nnodes!r}")
    low, high = pair
    assert isinstance(low, int) and isinstance(high, int)
    if low < 1:
        raise LaunchConfigError(f"nnodes={nnodes!r}: MIN must be at least 1 (the job goes on with MIN to MAX nodes)")
    if low > high:
        raise LaunchConfigError(
            f"nnodes={nnodes!r}: MIN ({low}) is more than MAX ({high}); pass (MIN, MAX), MIN <= MAX"
        )
    return low, high


#: ``(nnodes, node_rank, master_addr, master_port)`` as the caller passed them
NodeArgs = tuple[object, object, "str | None", object]


def launch(
    fn: Callable[..., object],
    args: tuple[object, ...],
    kwargs: Mapping[str, object],
    nproc: object,
    node: NodeArgs,
    max_restarts: object,
    backend: str | None = None,
    init_kwargs: Mapping[str, object] | None = None,
    **options: Any,
) -> list[object]:
    """``spawn``'s elastic launch: checked (``options``: ``elastic_plan``'s), then run; the return values."""
    if backend is not None:
        check_backend(backend)
    p = elastic_plan(nproc, *node, max_restarts, **options)
    return run(p, fn, args, kwargs, backend, init_kwargs)


def rank_main(
    fn: Callable[..., object],
    args: tuple[object, ...],
    kwargs: Mapping[str, object],
    backend: str | None,
    init_kwargs: Mapping[str, object],
) -> object:
    """What each rank runs (the agent sets LOCAL_RANK, RANK, WORLD_SIZE, MASTER_ADDR...)."""
    local_rank = int(os.environ["LOCAL_RANK"])
    if backend is None:
        return fn(local_rank, *args, **kwargs)
    _stack.initialize(backend, **init_kwargs)
    try:
        return fn(local_rank, *args, **kwargs)
    finally:
        _stack.finalize()


def run(
    p: _elastic.ElasticPlan,
    fn: Callable[..., object],
    args: tuple[object, ...],
    kwargs: Mapping[str, object],
    backend: str | None = None,
    init_kwargs: Mapping[str, object] | None = None,
) -> list[object]:
    """Run ``fn`` on this node's ranks under the agent; their return values in local-rank order."""
    from ._agent import run_agent  # deferred: torch.distributed.elastic is imported only for elastic jobs

    call = (fn, checked_args(fn, args), dict(kwargs), backend, dict(init_kwargs or {}))
    with _elastic.agent_scope({}, "idist.spawn") as logs:
        out = run_agent(p, rank_main, call, logs, _elastic.LAST_CALL, _elastic.MONITOR)
    if out.stopped_by == signal.SIGINT:
        raise KeyboardInterrupt
    if out.code:
        listed = "; ".join(f"{i + 1}) {c}" for i, c in enumerate(out.causes))
        rank, code = out.failed if out.failed is not None else (None, None)
        raise LaunchError(
            f"the elastic job failed after {max(len(out.causes) - 1, 0)} of {p.max_restarts} restarts; "
            f"each failure: {listed}",
            rank=rank,
            exitcode=code,
            signal_name=signal.Signals(-code).name if code is not None and code < 0 else None,
        )
    return [out.returns[i] for i in sorted(out.returns)]
