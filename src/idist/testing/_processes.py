"""A pool of real gloo processes, started once and kept for many runs.

Rank 0 opens the rendezvous store on a port the OS picks and tells the parent, which
passes it on, so no port is ever guessed. Every rank then calls the public
``idist.initialize("gloo", ...)``, the same path a user's script takes. A job is
``fn(ctx, *args)``, pickled by reference, so ``fn`` must be importable (a module-level
function); arguments and results must pickle. A rank that fails, dies or overruns ends the
whole pool (its peers may be stuck in a collective); the next run starts a fresh one.
"""

from __future__ import annotations

import datetime
import math
import multiprocessing
import multiprocessing.connection as mpc
import pickle
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import TypeVar, cast, final

from torch._C._distributed_c10d import TCPStore
from typing_extensions import TypeVarTuple, Unpack

# the whole public API is loaded while a process starts, not in a run's time (a job's first
# `from idist import ...` would otherwise import it there)
from .. import _api, _stack  # noqa: F401
from .._context import DistContext
from ._errors import RankFailedError, WorldTimeoutError, describe
from ._jobs import BREAK, BaseWorld, RemoteError, dumps, pack, serve_and_exit
from ._outcomes import Outcomes

#: the generic parameters of a run (``fn``'s result and arguments); the thread runner uses them too
R = TypeVar("R")
Ts = TypeVarTuple("Ts")

DEFAULT_TIMEOUT = 120.0
#: seconds the other ranks get to finish after one failed, before it breaks its group
BREAK_AFTER = 0.1
#: seconds the other ranks get to finish after that (those computing), before the pool is stopped
FAILURE_GRACE = 3.0
#: seconds for every rank to import torch and join the group (slow on a loaded machine)
START_TIMEOUT = 180.0


#: what a group's timeout is for a world without one (``timeout=math.inf``): longer than any test
LONGEST = 10 * 365 * 86400.0


def _worker(rank: int, world_size: int, conn: mpc.Connection, timeout: float, checked: bool) -> None:
    """A pool process: join the group, then run jobs until told to stop."""
    timeout = min(timeout, LONGEST)
    td = datetime.timedelta(seconds=max(timeout, START_TIMEOUT))
    try:
        if rank == 0:
            store = TCPStore("127.0.0.1", 0, world_size, True, timeout=td, wait_for_workers=False)
            conn.send(store.port)
        else:
            port = conn.recv()
            store = TCPStore("127.0.0.1", port, world_size, False, timeout=td)
        ctx = _stack.initialize("gloo", rank=rank, world_size=world_size, store=store, timeout=timeout, checked=checked)
        conn.send("ready")
    except BaseException as exc:
        conn.send_bytes(pack(False, exc))
        return
    serve_and_exit(ctx, f"rank {rank}", conn.recv_bytes, conn.send_bytes)


@final
class ProcessWorld(BaseWorld):
    """``world_size`` real processes on loopback, one gloo rank each, reused between runs.

    ``run(fn, *args)`` calls ``fn(ctx, *args)`` in every process (``ctx`` is that process's
    context, also the process default) and returns the results in rank order. A rank that
    raises makes ``run`` raise ``RankFailedError`` naming it, chained to its exception
    (with the remote traceback as a note); a run longer than ``timeout`` seconds raises
    ``WorldTimeoutError``. Either way the processes are stopped and the next run starts
    new ones. ``close()`` stops them; nothing is left behind.
    """

    KIND = "processes"

    def __init__(self, world_size: int, *, timeout: float = DEFAULT_TIMEOUT, checked: bool = True) -> None:
        super().__init__(world_size, timeout=timeout, checked=checked)
        self._procs: list[BaseProcess] = []
        self._conns: list[mpc.Connection] = []

    def start(self) -> None:
        """Start the processes and wait until every rank has joined the group."""
        if self._procs:
            return
        ctx = multiprocessing.get_context("spawn")
        try:
            for rank in range(self.world_size):
                parent, child = ctx.Pipe()
                p = ctx.Process(
                    target=_worker,
                    args=(rank, self.world_size, child, self.timeout, self.checked),
                    name=f"idist-pool-rank{rank}",
                    daemon=True,
                )
                p.start()
                child.close()
                self._procs.append(p)
                self._conns.append(parent)
            port = self._expect(0, time.monotonic() + START_TIMEOUT)
            for conn in self._conns[1:]:
                conn.send(port)
            deadline = time.monotonic() + START_TIMEOUT
            for rank in range(self.world_size):
                self._expect(rank, deadline)
        except BaseException:
            self._kill()
            raise

    def _expect(self, rank: int, deadline: float) -> object:
        conn = self._conns[rank]
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            raise WorldTimeoutError((rank,), self.world_size, START_TIMEOUT, {})
        try:
            raw = conn.recv_bytes()
        except EOFError:
            raise RankFailedError(rank, self.world_size, {rank: self._died(rank)}) from None
        value = pickle.loads(raw)
        if isinstance(value, tuple) and value and value[0] is False:
            exc: BaseException = value[1]
            raise RankFailedError(rank, self.world_size, {rank: exc}) from exc
        return value

    def _died(self, rank: int) -> BaseException:
        p = self._procs[rank]
        p.join(1.0)
        return RemoteError(f"process of rank {rank} died (exit code {p.exitcode})")

    def run(self, fn: Callable[[DistContext, Unpack[Ts]], R], *args: *Ts) -> list[R]:
        """Call ``fn(ctx, *args)`` on every rank; the results in rank order."""
        self.start()
        job = dumps((fn, args))
        out: Outcomes[R] = Outcomes(self.world_size)
        deadline = time.monotonic() + self.timeout
        waiting = {conn: rank for rank, conn in enumerate(self._conns)}
        failed_at, broke = math.inf, False
        try:
            for conn in self._conns:
                conn.send_bytes(job)
            while waiting:
                # after a failure, give the others a moment to finish: if they all do, no rank
                # waits in a collective for the failed one and the pool can stay; else the failed
                # rank breaks its group (they raise at once) and the pool is replaced
                if out.failures and not broke and time.monotonic() >= failed_at + BREAK_AFTER:
                    broke = self._break(next(iter(out.failures)), out)
                until = min(deadline, failed_at + (FAILURE_GRACE if broke else BREAK_AFTER))
                left = until - time.monotonic()
                ready = mpc.wait(list(waiting), timeout=None if math.isinf(left) else left) if left > 0 else []
                if not ready and (broke or not out.failures):
                    break
                for got in ready:
                    rank = waiting.pop(cast(mpc.Connection, got))
                    out.add(rank, *self._receive(rank))
                    if out.failures and math.isinf(failed_at):
                        failed_at = time.monotonic()
        except BaseException:
            self._kill()
            raise
        if waiting or broke:
            self._kill()  # ranks stuck in a collective with a failed one, or a group broken on purpose
            if not out.failures:
                raise out.timeout_error(self.timeout)
        out.raise_first_failure()
        return out.in_rank_order()

    def _break(self, rank: int, out: Outcomes[R]) -> bool:
        """Have failed ``rank`` break its group, so that peers waiting for it raise now."""
        why = f"rank {rank}, which raised {describe(out.failures[rank])}"
        try:
            self._conns[rank].send_bytes(BREAK + why.encode())
        except OSError:
            pass  # its process is gone: its connections closed with it
        return True

    def _receive(self, rank: int) -> tuple[bool, object]:
        try:
            raw = self._conns[rank].recv_bytes()
        except EOFError:
            return False, self._died(rank)
        try:
            ok, value = pickle.loads(raw)
        except Exception as exc:
            return False, RemoteError(f"rank {rank}'s reply could not be unpickled here: {exc!r}")
        return bool(ok), value

    def _kill(self) -> None:
        procs, conns = self._procs, self._conns
        self._procs, self._conns = [], []
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5.0)
        for conn in conns:
            conn.close()

    def close(self) -> None:
        """Stop the processes (each finalizes its group). Safe to call twice."""
        procs, conns = self._procs, self._conns
        self._procs, self._conns = [], []
        for conn in conns:
            try:
                conn.send_bytes(b"")
            except OSError:
                pass
        for p in procs:
            p.join(10.0)
            if p.is_alive():
                p.kill()
                p.join(5.0)
        for conn in conns:
            conn.close()
