"""Rank functions for ``spawn``/``Parallel`` with a driven backend (horovod, xla-tpu).

Imported by name in each rank (``tests`` is on the ranks' path). ``report`` says what the
rank sees; ``fail_on`` makes one rank fail in a given way while the others wait in a
barrier; ``sleeper`` writes its pid and sleeps, to be interrupted.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

import idist
from idist import _detect
from idist.launch import launched_by


def report(local_rank: int, x: float, scale: int = 1) -> dict[str, Any]:
    """ignite's form: the backend's context is current (in this rank or thread) around fn."""
    ctx = idist.current()
    return {
        "type": type(ctx).__name__,
        "backend": idist.backend(),
        "rank": idist.get_rank(),
        "world_size": idist.get_world_size(),
        "local_rank_arg": local_rank,
        "local_rank": ctx.local_rank,
        "device": ctx.device.type,
        "horovod_rank": os.environ.get("HOROVOD_RANK"),
        "sum": idist.all_reduce(x * (ctx.rank + 1)) * scale,
        "tensor": idist.all_reduce(torch.tensor([ctx.rank + 1.0])).tolist(),
        "gathered": idist.all_gather(f"r{ctx.rank}"),
        "detected": _detect.detect_backend(),
        "launched_by": launched_by(),
        "leaked": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT")},
        "pid": os.getpid(),
    }


def fail_on(local_rank: int, bad_rank: int, marker: str, how: str = "raise") -> int:
    """Rank ``bad_rank`` fails as ``how`` says (raise, sigkill, exit, unpicklable); the others
    wait for it in a barrier."""
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
