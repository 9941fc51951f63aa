"""``HorovodWorld``: a property-suite runner whose ranks are real Horovod processes.

``IDIST_PROPERTY_RUNNER="hvd_world:HorovodWorld@2" pytest properties`` (with this folder
on ``PYTHONPATH``) runs the whole property suite on Horovod. The world starts
``horovodrun -np N -H localhost:N --gloo`` once, in its own session; every rank connects
back over loopback (a random authkey) and serves jobs. A rank that fails, dies or overruns
ends the world (its peers may be stuck in a collective): the whole process group is
killed and the next run starts a fresh one.
"""

from __future__ import annotations

import multiprocessing.connection as mpc
import os
import pickle
import queue
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from idist.testing import RankFailedError, WorldTimeoutError

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
R = TypeVar("R")
START_TIMEOUT = 180.0


class HorovodWorld:
    def __init__(self, world_size: int, *, timeout: float = 120.0) -> None:
        self.world_size = world_size
        self.timeout = timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._conns: list[mpc.Connection] = []
        self._log: Any = None

    @property
    def name(self) -> str:
        return f"horovod@{self.world_size}"

    def start(self) -> None:
        if self._proc is not None:
            return
        authkey = secrets.token_bytes(16)
        n = self.world_size
        with mpc.Listener(("127.0.0.1", 0), authkey=authkey) as listener:
            host, port = listener.address
            env = dict(os.environ, IDIST_POOL_AUTHKEY=authkey.hex())
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(HERE), env.get("PYTHONPATH")]))
            self._log = tempfile.TemporaryFile()
            horovodrun = Path(sys.executable).parent / "horovodrun"
            cmd = [
                str(horovodrun), "-np", str(n), "-H", f"localhost:{n}", "--gloo", "--disable-cache",
                "--gloo-timeout-seconds", str(int(self.timeout)), "--start-timeout", str(int(START_TIMEOUT)),
                sys.executable, str(HERE / "_pool_worker.py"), host, str(port),
            ]  # fmt: skip
            self._proc = subprocess.Popen(
                cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
            )
            conns: dict[int, mpc.Connection] = {}
            accepted: queue.Queue[mpc.Connection] = queue.Queue()

            def accept() -> None:
                try:
                    for _ in range(n):
                        accepted.put(listener.accept())
                except OSError:
                    pass  # the listener closed: start-up gave up

            threading.Thread(target=accept, name="hvd-world-accept", daemon=True).start()
            deadline = time.monotonic() + START_TIMEOUT
            try:
                while len(conns) < n:
                    try:
                        conn = accepted.get(timeout=0.5)
                    except queue.Empty:
                        if self._proc.poll() is not None or time.monotonic() > deadline:
                            missing = tuple(r for r in range(n) if r not in conns)
                            raise WorldTimeoutError(missing, n, START_TIMEOUT, {}) from None
                        continue
                    rank, raw = pickle.loads(conn.recv_bytes())
                    ok, value = pickle.loads(raw)
                    if not ok:
                        raise RankFailedError(rank, n, {rank: value}) from value
                    conns[rank] = conn
            except BaseException as exc:
                self._kill()
                exc.add_note(f"--- horovodrun output ---\n{self.output()}")
                raise
        self._conns = [conns[r] for r in range(n)]

    def output(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return str(self._log.read()[-4000:].decode(errors="replace"))

    def run(self, fn: Callable[..., R], *args: Any) -> list[R]:
        self.start()
        job = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        results: dict[int, R] = {}
        waiting = {conn: rank for rank, conn in enumerate(self._conns)}
        deadline = time.monotonic() + self.timeout
        try:
            for conn in self._conns:
                conn.send_bytes(job)
            while waiting:
                left = deadline - time.monotonic()
                ready = mpc.wait(list(waiting), timeout=max(0.0, left)) if left > 0 else []
                if not ready:
                    raise WorldTimeoutError(tuple(sorted(waiting.values())), self.world_size, self.timeout, {})
                for got in ready:
                    rank = waiting.pop(got)  # type: ignore[call-overload]
                    try:
                        ok, value = pickle.loads(self._conns[rank].recv_bytes())
                    except EOFError:
                        ok, value = False, RuntimeError(f"horovod rank {rank} died:\n{self.output()}")
                    if not ok:
                        raise RankFailedError(rank, self.world_size, {rank: value}) from value
                    results[rank] = value
        except BaseException:
            self._kill()
            raise
        return [results[r] for r in range(self.world_size)]

    def _kill(self) -> None:
        proc, conns = self._proc, self._conns
        self._proc, self._conns = None, []
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        for conn in conns:
            conn.close()

    def close(self) -> None:
        proc, conns = self._proc, self._conns
        if proc is None:
            return
        for conn in conns:
            try:
                conn.send_bytes(b"")
            except OSError:
                pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self._kill()
        if self._log is not None:
            self._log.close()
            self._log = None
