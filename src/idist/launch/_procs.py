"""``start``: one process per local rank of a ``LaunchPlan``, watched by a ``SpawnHandle``.

Ranks watch their parent and exit if it dies (``_child``). The rendezvous port is
reserved by the parent (``_ports``) until the launch ends, so two launches at once never
collide.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from .. import _marks
from .._errors import LaunchError
from .._rank_vars import INHERITED_RANK_VARS
from . import _sessions
from ._child import ChildSpec, child_main
from ._handle import SpawnHandle
from ._plan import LaunchPlan, check_start_method, checked_args
from ._ports import LOOPBACK, PortReservation, reserve_port
from ._stopping import Held, Rank

R = TypeVar("R")


def start(
    fn: Callable[..., R],
    args: tuple[object, ...],
    kwargs: Mapping[str, object],
    plan: LaunchPlan,
    *,
    daemon: bool = False,
    start_method: str = "spawn",
    backend: str | None = None,
    init_kwargs: Mapping[str, object] | None = None,
    rank_env: bool = True,
    extra_env: Mapping[str, str] | None = None,
    join: bool = False,
) -> SpawnHandle[R]:
    """Start ``plan.nproc_per_node`` ranks running ``fn``; see ``idist.spawn``.

    ``rank_env=False`` starts processes that are not ranks themselves (a launcher such as
    ``horovod.run`` inside them starts the ranks): no port is reserved and no RANK,
    MASTER_ADDR... is set for them. ``extra_env``: more variables for every process.
    ``join``: wait for them here, so that no moment between the start and the wait lets a
    Ctrl-C leave them running.
    """
    args = checked_args(fn, args)
    check_start_method(start_method)
    plan.check()
    reservation: PortReservation | None = None
    addr = plan.master_addr or LOOPBACK
    if rank_env and plan.master_port is None:
        reservation = reserve_port(addr)
        plan = attrs.evolve(plan, master_addr=addr, master_port=reservation.port)
    elif rank_env:
        plan = attrs.evolve(plan, master_addr=addr)
    ctx: Any = mp.get_context(start_method)  # typeshed: a BaseContext, which has no Process
    ranks: list[Rank] = []
    handle: SpawnHandle[R] = SpawnHandle(ranks, reservation, plan, _sessions.Sweeper())
    # -1: a forkserver child's parent is the server; a launch from another thread than the main
    # one may outlive that thread, and PR_SET_PDEATHSIG would follow the thread
    main_thread = threading.current_thread() is threading.main_thread()
    parent_pid = os.getpid() if start_method != "forkserver" and main_thread else -1
    # the ranks' stall marks: a node-mate in flight at a failed call is never named missing
    board = _marks.board(plan.nproc_per_node) if rank_env else None
    try:
        for local in range(plan.nproc_per_node):
            t = plan.topology(local)
            rank = t.rank
            env = {
                "RANK": str(rank),
                "LOCAL_RANK": str(local),
                "WORLD_SIZE": str(t.world_size),
                "LOCAL_WORLD_SIZE": str(t.nproc_per_node),
                "GROUP_RANK": str(t.node_rank),
                "NNODES": str(t.nnodes),
                "MASTER_ADDR": addr,
                "MASTER_PORT": str(plan.master_port),
                "IDIST_LAUNCHER": "idist.spawn",
            }
            # None: removed in the child (an enclosing launcher's variable that would contradict this rank)
            child_env = {**dict.fromkeys(INHERITED_RANK_VARS), **(env if rank_env else {}), **(extra_env or {})}
            spec = ChildSpec(
                fn=fn,
                args=args,
                kwargs=dict(kwargs),
                local_rank=local,
                rank=rank,
                env=child_env,
                parent_pid=parent_pid,
                backend=backend,
                init_kwargs=dict(init_kwargs or {}),
                marks=None if board is None else board.handed(local),
            )
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=child_main, args=(spec, writer), daemon=daemon, name=f"idist-rank-{rank}")
            with Held():  # a Ctrl-C here waits until the rank is in ``ranks``, which the clean-up stops
                try:
                    proc.start()
                except Exception as e:
                    reader.close()
                    writer.close()
                    why = f"{type(e).__name__}: {e}; {_hint(start_method)}"
                    raise LaunchError(f"could not start rank {rank}: {why}") from e
                writer.close()  # the child holds the only write end: EOF means it is gone
                ranks.append(Rank(local, rank, proc, reader))
                handle.watch(proc.pid)
        if join:
            handle.join()
    except BaseException:
        handle._stop()
        raise
    finally:
        if board is not None:
            board.close()  # each started rank holds its own descriptor
    return handle


def _hint(start_method: str) -> str:
    if start_method == "fork":
        return "see the error above"
    return (
        "with start_method='spawn', fn and args must be picklable: fn a module-level function "
        "(not a lambda, closure or a function defined in `python -c`)"
    )
