"""Rank functions for ``spawn``/``Parallel`` with backend="horovod" (imported by name in each rank).

Run as a script it is the parent of a launch, for the tests that signal or kill the parent:
``python cases_spawn.py MARKER N`` spawns N Horovod ranks that write their pid and sleep.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import idist
from idist import _stack
from idist.launch import launched_by


def report(local_rank: int, x: float, scale: int = 1) -> dict[str, Any]:
    """ignite's form: the Horovod context is current around fn."""
    ctx = idist.current()
    return {
        "type": type(ctx).__name__,
        "backend": idist.backend(),
        "rank": idist.get_rank(),
        "world_size": idist.get_world_size(),
        "local_rank_arg": local_rank,
        "local_rank": ctx.local_rank,
        "horovod_rank": os.environ.get("HOROVOD_RANK"),
        "sum": idist.all_reduce(x * (ctx.rank + 1)) * scale,
        "gathered": idist.all_gather(f"r{ctx.rank}"),
        "detected": _stack.detect_backend(),
        "launched_by": launched_by(),
        "leaked": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT")},
    }


def fail_on(local_rank: int, bad_rank: int, how: str, marker: str) -> int:
    """Rank ``bad_rank`` fails as ``how`` says; the others wait for it in a barrier."""
    rank = idist.get_rank()
    Path(f"{marker}.{rank}").write_text(str(os.getpid()))
    if rank == bad_rank:
        time.sleep(0.5)  # the peers are in the barrier by now
        if how == "raise":
            raise ZeroDivisionError(f"deliberate failure on rank {rank}")
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "exit":
            sys.exit(3)
        if how == "unpicklable":
            return threading.Lock()  # type: ignore[return-value]
    idist.barrier()
    return rank


def sleeper(local_rank: int, marker: str) -> None:
    Path(f"{marker}.{idist.get_rank()}").write_text(str(os.getpid()))
    time.sleep(600)


if __name__ == "__main__":
    idist.spawn("horovod", sleeper, (sys.argv[1],), nproc_per_node=int(sys.argv[2]))
