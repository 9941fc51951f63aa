"""Run a function on N real gloo processes on loopback, with a hard timeout.

The test suite's own harness, independent of ``idist.spawn`` so that a launcher bug
cannot hide a core bug. ``run_ranks(fn, n, *args)`` starts ``n`` spawned processes with
torchrun-style variables (a free port each time), calls ``fn(rank, *args)`` in each, and
returns the results in rank order. A rank that raises fails the call with its traceback
(a rank in ``may_die`` that dies gives ``("died", exitcode)`` instead);
a run past ``timeout`` kills every process and raises ``TimeoutError`` naming the ranks
that did not finish. The processes fork from a forkserver that has imported torch and idist
once (a fresh interpreter importing torch costs seconds per rank), and take the caller's
environment and working folder as they are at the call.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any


class RankFailed(AssertionError):
    def __init__(self, rank: int, tb: str) -> None:
        super().__init__(f"rank {rank} failed:\n{tb}")
        self.rank = rank
        self.tb = tb


# Ports below the kernel's ephemeral range (32768-60999 by default), 1000 for each pytest-xdist
# worker ("gw0", "gw1", ...; a run without xdist uses the first range). A port the OS picked
# (bind to 0, close) could be taken by any outgoing connection before the store binds it;
# these are never handed out by the kernel, and no two workers share one.
_PORTS_BASE, _PORTS_PER_WORKER = 20000, 1000
_worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % 12
_next = itertools.count(os.getpid() % _PORTS_PER_WORKER)


def free_port() -> int:
    """A loopback port that is free now, from this worker's own range."""
    for _ in range(_PORTS_PER_WORKER):
        port = _PORTS_BASE + _PORTS_PER_WORKER * _worker + next(_next) % _PORTS_PER_WORKER
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_PORTS_BASE + _PORTS_PER_WORKER * _worker} + {_PORTS_PER_WORKER}")


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "idist._api"])  # idist loads its names on use
    return ctx


def _child(fn: Callable[..., Any], rank: int, env: dict[str, str], cwd: str, args: tuple[Any, ...], q: Any) -> None:
    os.environ.clear()  # the forkserver's environment is the one it started with: take the caller's
    os.environ.update(env)
    os.chdir(cwd)
    try:
        q.put((rank, True, fn(rank, *args)))
    except BaseException:
        q.put((rank, False, traceback.format_exc()))


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 90.0,
    env: dict[str, str] | None = None,
    set_launcher_env: bool = True,
    may_die: frozenset[int] = frozenset(),
) -> list[Any]:
    ctx = _context()
    q = ctx.Queue()
    port = str(free_port())
    procs = []
    for rank in range(world_size):
        e = dict(os.environ, **(env or {}))
        if set_launcher_env:
            e.update(
                RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
            )  # fmt: skip
        p = ctx.Process(target=_child, args=(fn, rank, e, os.getcwd(), args, q), daemon=True)
        p.start()
        procs.append(p)
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(world_size)) - set(results))
                raise TimeoutError(f"ranks {missing} did not finish within {timeout}s")
            try:
                rank, ok, value = q.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in results]
                for r in dead:
                    if r not in may_die:
                        raise RankFailed(r, f"process exited with code {procs[r].exitcode}") from None
                    results[r] = ("died", procs[r].exitcode)
                continue
            if not ok:
                raise RankFailed(rank, value)
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        q.close()
    return [results[r] for r in range(world_size)]
