"""``XlaWorld``: a runner whose ranks are the XLA CPU device threads of one process.

It starts one process with ``PJRT_DEVICE=CPU`` and ``CPU_NUM_DEVICES=world_size`` (what
``xmp.spawn`` does on the CPU), keeps one thread per device with its own ``XlaContext``,
and runs jobs ``fn(ctx, *args)`` on all of them (jobs and results pickle). A failure or an
overrun stops the process; the next run starts a fresh one. It needs torch_xla (the XLA
lane's venv)::

    IDIST_PROPERTY_RUNNER="idist.testing._xla_world:XlaWorld@2" pytest properties
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection as mpc
import os
import pickle
import queue
import threading
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import TypeVar, final

from typing_extensions import TypeVarTuple, Unpack

from .. import _stack
from .._backends.xla import XlaContext
from .._context import DistContext
from .._errors import LaunchEnvironmentError
from .._exit import exit_now
from ._errors import RankFailedError, WorldTimeoutError
from ._jobs import BaseWorld, RemoteError, pack, serve
from ._outcomes import Outcomes

R = TypeVar("R")
Ts = TypeVarTuple("Ts")

DEFAULT_TIMEOUT = 180.0
#: seconds to import torch_xla and bring up the runtime (slow on a loaded machine)
START_TIMEOUT = 300.0


def _rank_thread(
    rank: int, device: object, jobs: queue.Queue[bytes | None], results: queue.Queue[tuple[int, bytes]], timeout: float
) -> None:
    import torch_xla  # optional: only the XLA lane's venv has it

    torch_xla._XLAC._xla_set_default_device(device)
    ctx = XlaContext.create("xla-tpu", timeout=timeout)
    with _stack.use(ctx):
        serve(ctx, f"XLA rank {rank}", lambda: jobs.get() or b"", lambda reply: results.put((rank, reply)))


def _host(world_size: int, conn: mpc.Connection, timeout: float) -> None:
    """The XLA process: one thread per device, jobs until told to stop."""
    os.environ["PJRT_DEVICE"] = "CPU"
    os.environ["CPU_NUM_DEVICES"] = str(world_size)
    # torch_xla runs each device's program on its own thread pool; a collective parks one
    # thread per device until all arrive, so the pool must outnumber the devices.
    os.environ.setdefault("XLA_THREAD_POOL_SIZE", str(4 * world_size + 8))
    try:
        import torch_xla.core.xla_model as xm  # optional: only the XLA lane's venv has it
        from torch_xla._internal import pjrt  # (see above)

        pjrt.initialize_multiprocess(0, 1)
        devices = xm.get_xla_supported_devices()
        if len(devices) != world_size:
            raise LaunchEnvironmentError(f"asked for {world_size} XLA CPU devices, the runtime has {devices}")
        results: queue.Queue[tuple[int, bytes]] = queue.Queue()
        queues: list[queue.Queue[bytes | None]] = []
        for rank, device in enumerate(devices):
            jobs: queue.Queue[bytes | None] = queue.Queue()
            queues.append(jobs)
            threading.Thread(
                target=_rank_thread,
                args=(rank, device, jobs, results, timeout),
                daemon=True,
                name=f"idist-xla-rank{rank}",
            ).start()
        conn.send("ready")
    except BaseException as exc:
        conn.send_bytes(pack(False, exc))
        return
    try:
        while True:
            job = conn.recv_bytes()
            if not job:
                break
            for q in queues:
                q.put(job)
            for _ in range(world_size):
                rank, reply = results.get()
                conn.send_bytes(pickle.dumps((rank, reply)))
    except (EOFError, OSError):
        pass
    finally:
        for q in queues:
            q.put(None)
        exit_now(0)


@final
class XlaWorld(BaseWorld):
    """``world_size`` XLA CPU device threads in one process, reused between runs (a ``Runner``)."""

    KIND = "xla"

    def __init__(self, world_size: int, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(world_size, timeout=timeout, checked=False)  # no checked mode on XLA
        self._proc: BaseProcess | None = None
        self._conn: mpc.Connection | None = None

    def start(self) -> mpc.Connection:
        if self._conn is not None:
            return self._conn
        mp = multiprocessing.get_context("spawn")
        parent, child = mp.Pipe()
        proc = mp.Process(
            target=_host, args=(self.world_size, child, self.timeout), name="idist-xla-world", daemon=True
        )
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        try:
            if not parent.poll(START_TIMEOUT):
                raise WorldTimeoutError(tuple(range(self.world_size)), self.world_size, START_TIMEOUT, {})
            raw = parent.recv_bytes()
        except EOFError:
            self.close()
            raise RankFailedError(0, self.world_size, {0: RemoteError("the XLA process died while starting")}) from None
        except BaseException:
            self.close()
            raise
        value = pickle.loads(raw)
        if value != "ready":
            self.close()
            exc: BaseException = value[1]
            raise RankFailedError(0, self.world_size, {0: exc}) from exc
        return parent

    def run(self, fn: Callable[[DistContext, Unpack[Ts]], R], *args: *Ts) -> list[R]:
        """Call ``fn(ctx, *args)`` on every device thread; the results in rank order."""
        conn = self.start()
        out: Outcomes[R] = Outcomes(self.world_size)
        try:
            conn.send_bytes(pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL))
            for _ in range(self.world_size):
                if not conn.poll(self.timeout):
                    raise out.timeout_error(self.timeout)
                try:
                    rank, reply = pickle.loads(conn.recv_bytes())
                except EOFError:
                    dead = RemoteError(f"the XLA process died (exit code {self._exitcode()})")
                    out.failures.setdefault(next(iter(out.failures), min(out.unfinished)), dead)
                    out.raise_first_failure()
                out.add(rank, *pickle.loads(reply))
            out.raise_first_failure()
        except BaseException:
            self.close()
            raise
        return out.in_rank_order()

    def _exitcode(self) -> object:
        if self._proc is None:
            return None
        self._proc.join(2.0)
        return self._proc.exitcode

    def close(self) -> None:
        """Stop the XLA process. Safe to call twice."""
        conn, proc = self._conn, self._proc
        self._conn = self._proc = None
        if conn is not None:
            try:
                conn.send_bytes(b"")
            except OSError:
                pass
            conn.close()
        if proc is not None:
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
