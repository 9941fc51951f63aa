"""A TCP proxy in front of a real TCPStore that counts what the store serves.

Clients connect to the proxy as if it were the store; every byte goes through unchanged. The
client-to-store stream is parsed with the store's wire format (torch 2.13: a one-byte query type,
keys and payloads as a uint64 length and bytes), so the counts are those of the requests the store
received: ``requests`` (every query but the two a connection starts with, ``VALIDATE`` and
``PING``) and ``keys`` (the keys those requests name: one for set/get/add/compare_set/append/
delete, N for check/wait/multi_get/multi_set of N keys). torch's ``get`` is a ``WAIT`` and a
``GET`` (two requests), ``multi_get`` a ``WAIT`` and a ``MULTI_GET``.

In-process (``CountingProxy(port).start()``) it runs on a daemon thread: fine for store calls
that release the GIL while they wait (all that idist uses); ``list_keys`` does not, so call it
on the store itself, never through an in-process proxy. ``python store_counter.py PORT`` runs
it as a process: it prints its port, then answers each line ``stats`` / ``reset`` on stdin
with one JSON line (``spawn_proxy`` does this; the scale benchmark uses it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

NAMES = (
    "VALIDATE", "SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS", "DELETE_KEY", "APPEND",
    "MULTI_GET", "MULTI_SET", "CANCEL_WAIT", "PING", "QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN",
)  # fmt: skip
_SETUP = {0, 13}


class _Short(Exception):
    """The buffer ends inside a query: wait for more bytes."""


def _u64(buf: bytes, pos: int) -> tuple[int, int]:
    if pos + 8 > len(buf):
        raise _Short
    return struct.unpack_from("<Q", buf, pos)[0], pos + 8


def _blob(buf: bytes, pos: int) -> int:
    n, pos = _u64(buf, pos)
    if pos + n > len(buf):
        raise _Short
    return pos + n


def parse(buf: bytes, pos: int) -> tuple[int, int, int]:
    """One query at ``pos``: (its end, its type, the keys it names); ``_Short`` if incomplete,
    ``ValueError`` for a type this parser does not know."""
    if pos >= len(buf):
        raise _Short
    code = buf[pos]
    pos += 1
    keys = 1
    if code in (0, 13):  # VALIDATE magic / PING nonce: uint32
        if pos + 4 > len(buf):
            raise _Short
        return pos + 4, code, 0
    if code in (7, 12):
        return pos, code, 0
    if code in (3, 8, 15, 16):  # GET, DELETE_KEY, QUEUE_POP, QUEUE_LEN: a key
        return _blob(buf, pos), code, keys
    if code in (1, 9, 14):  # SET, APPEND, QUEUE_PUSH: a key and a payload
        return _blob(buf, _blob(buf, pos)), code, keys
    if code == 2:  # COMPARE_SET: key, expected, desired
        return _blob(buf, _blob(buf, _blob(buf, pos))), code, keys
    if code == 4:  # ADD: key, int64
        pos = _blob(buf, pos)
        if pos + 8 > len(buf):
            raise _Short
        return pos + 8, code, keys
    if code in (5, 6, 10):  # CHECK, WAIT, MULTI_GET: count, keys
        n, pos = _u64(buf, pos)
        for _ in range(n):
            pos = _blob(buf, pos)
        return pos, code, n
    if code == 11:  # MULTI_SET: count, (key, payload) pairs
        n, pos = _u64(buf, pos)
        for _ in range(n):
            pos = _blob(buf, _blob(buf, pos))
        return pos, code, n
    raise ValueError(f"unknown store query type {code}")


@contextlib.contextmanager
def _until_closed(writer: asyncio.StreamWriter) -> Iterator[None]:
    """A dropped connection ends the body quietly; ``writer`` is closed after it, whatever happened."""
    try:
        yield
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class CountingProxy:
    """Forwards connections to the store at ``host:port`` and counts the queries it receives."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.upstream = (host, port)
        self.port = 0
        self._lock = threading.Lock()
        self._ops: Counter[str] = Counter()
        self._keys = 0
        self._connections = 0
        self._unparsed = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        #: set: every request from now on is swallowed, unanswered (a store cut off by a partition)
        self.frozen = threading.Event()

    # -- counts ---------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._lock:
            ops = dict(self._ops)
            requests = sum(n for name, n in ops.items() if name not in ("VALIDATE", "PING"))
            return {
                "requests": requests,
                "keys": self._keys,
                "connections": self._connections,
                "unparsed_streams": self._unparsed,
                "ops": ops,
            }

    def reset(self) -> None:
        with self._lock:
            self._ops.clear()
            self._keys = 0
            self._connections = 0

    def _count(self, code: int, keys: int) -> None:
        with self._lock:
            self._ops[NAMES[code]] += 1
            if code not in _SETUP:
                self._keys += keys

    # -- serving --------------------------------------------------------------------------------
    def start(self) -> CountingProxy:
        threading.Thread(target=self._run, name="store-counter", daemon=True).start()
        self._ready.wait(10)
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        server = loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0, backlog=16384))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        loop.run_forever()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        with self._lock:
            self._connections += 1
        await asyncio.gather(self._requests(reader, up_writer), self._replies(up_reader, writer))

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        buf = b""
        parsing = True
        with _until_closed(writer):
            while data := await reader.read(1 << 16):
                if self.frozen.is_set():
                    continue
                writer.write(data)
                if parsing:
                    buf += data
                    pos = 0
                    try:
                        while True:
                            end, code, keys = parse(buf, pos)
                            self._count(code, keys)
                            pos = end
                    except _Short:
                        buf = buf[pos:]
                    except ValueError:
                        parsing = False
                        buf = b""
                        with self._lock:
                            self._unparsed += 1
                await writer.drain()

    async def _replies(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with _until_closed(writer):
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()


class ProxyProcess:
    """``CountingProxy`` in a process of its own (it then never competes for the GIL)."""

    def __init__(self, port: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def _ask(self, what: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return dict(json.loads(self.proc.stdout.readline()))

    def stats(self) -> dict[str, Any]:
        return self._ask("stats")

    def reset(self) -> None:
        self._ask("reset")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def simulated_rank(rank: int, world_size: int, nproc: int) -> Any:
    """The ``LaunchInfo`` of rank ``rank`` in a job of ``world_size`` ranks, ``nproc`` per node."""
    from idist._launch_env import LaunchInfo  # only where ranks are simulated: the proxy process needs no torch
    from idist._topology import Topology

    topology = Topology(
        rank=rank, world_size=world_size, local_rank=rank % nproc, nproc_per_node=nproc,
        node_rank=rank // nproc, nnodes=-(-world_size // nproc),
    )  # fmt: skip
    return LaunchInfo(launcher="simulated", topology=topology, master_addr=None, master_port=None, decided_by={})


def _main() -> None:
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # two descriptors per client
    proxy = CountingProxy(int(sys.argv[1])).start()
    print(proxy.port, flush=True)
    for line in sys.stdin:
        if line.strip() == "reset":
            proxy.reset()
        print(json.dumps(proxy.stats()), flush=True)


if __name__ == "__main__":
    _main()
