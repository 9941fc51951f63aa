"""idist's own machinery at N ranks: liveness, join and failure diagnosis against a real TCPStore.

N simulated ranks, spread over a few worker processes (whole nodes of ``--nproc`` ranks each),
each with its own connections to one real TCPStore (libuv, as idist serves it), run idist's real
code: ``_rendezvous.join``, the heartbeat (``_liveness.heartbeat``: its threads, its node board,
its store calls) and ``Guard.report``. A proxy in front of the store (tests/store_counter.py)
counts the requests and the keys they name, at the store. Per N:

- join: every rank joins at once; ``join_s`` from the start to the last rank's return,
  ``join_requests`` what the store served meanwhile;
- liveness: every rank's heartbeat runs; after a warm-up, ``store_requests_per_s`` and
  ``store_keys_per_s`` over ``--window`` seconds (steady state: nobody waits, nobody is lost);
- detection: rank N-1 goes silent (its heartbeat stops, as a frozen process's would); rank 0
  asks ``lost()`` every interval, as a waiting collective does: ``detect_s`` until it names it;
- diagnosis (printed, not in the JSON): N-1 ranks run ``Guard.report`` for a failed collective
  that rank N/2 never reached; seconds, requests, and whether every rank named exactly that one.

    .venv/bin/python benchmarks/bench_scale.py --ranks 64,1024,4096 --json OUT

A phase that does not finish within ``--cap`` seconds is recorded as null (today's code at large
N). The same script measures another checkout's code with ``PYTHONPATH=CHECKOUT/src``.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import multiprocessing as mp
import resource
import socket
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from store_counter import ProxyProcess, simulated_rank

TIMEOUT = datetime.timedelta(seconds=600)


def _raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _threads(fns: list[Any], cap: float) -> tuple[list[Any], float | None]:
    """Run every fn at once in a thread; (results, seconds until the last returned or None)."""
    out: list[Any] = [None] * len(fns)
    ends: list[float] = [0.0] * len(fns)

    def run(i: int) -> None:
        try:
            out[i] = fns[i]()
        except Exception as exc:
            out[i] = exc
        ends[i] = time.monotonic()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(fns))]
    start = time.monotonic()
    for t in threads:
        t.start()
    deadline = start + cap
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        return out, None
    return out, max(ends) - start


def _pooled(fns: list[Any], width: int = 64) -> list[Any]:
    """``fns`` run ``width`` at a time: a connection costs torch a reverse lookup of its peer's
    address, which a slow resolver can make seconds long; in parallel they overlap."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(width) as pool:
        return list(pool.map(lambda fn: fn(), fns))


def _reporter(store: Any, rank: int, world: int) -> Any:
    """Rank ``rank``'s ``Guard.report`` for an all_reduce of the world that failed (its guard made
    beforehand, as a rank's is): the call returns whom it names."""
    from torch._C._distributed_c10d import PrefixStore

    from idist._backends.native._guard import Guard
    from idist._backends.native._verdict import Fault, Verdict

    step = SimpleNamespace(seq=7)
    comm: Any = SimpleNamespace(key="world", ranks=tuple(range(world)), group_rank=rank, lockstep=step)
    verdict = Verdict("all_reduce", tuple(range(world)), Fault.LOST)
    guard = Guard(PrefixStore("bench/guard", store), TIMEOUT)
    return lambda: guard.report(comm, verdict, guard.count_in(comm)).missing


def _agreer(store: Any, rank: int, world: int) -> Any:
    """Rank ``rank``'s ``Guard.agree`` for the same bad input on every rank (each failed before
    communicating): the call returns None when every rank of the world failed alike."""
    from torch._C._distributed_c10d import PrefixStore

    from idist._backends.native._guard import Guard
    from idist._errors import CollectiveInputError

    step = SimpleNamespace(seq=3, agreed=0)
    # slice=None: a group whose waits cannot look (nccl), which waits the blind window (0.3 s) for
    # the others, as every group did when RESULTS.md was measured (gloo's now waits the timeout)
    comm: Any = SimpleNamespace(key="world", ranks=tuple(range(world)), group_rank=rank, lockstep=step, slice=None)
    guard = Guard(PrefixStore("bench/guard", store), TIMEOUT)
    exc = CollectiveInputError(f"src={world} is outside 0..{world - 1}")
    return lambda: guard.agree(comm, "broadcast", exc)


class Driver:
    """Runs every simulated rank's heartbeat on one thread of this process, each once an interval,
    spread over it: the same code the heartbeat's own threads run (``tick``: the watcher's look,
    then the store round; today's code: its one thread's ``_round``), without 2 threads a rank,
    which at 4,096 ranks on 2 cores would measure the scheduler instead."""

    def __init__(self, beats: dict[int, Any], interval: float) -> None:
        self.ticks: dict[int, Any] = {}
        for r, beat in beats.items():
            if "threads" in inspect.signature(beat.start).parameters:
                beat.start(threads=False)
                self.ticks[r] = beat.tick
            else:
                self.ticks[r] = beat._round
        self.interval = interval
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def drop(self, rank: int) -> None:
        with self.lock:
            del self.ticks[rank]

    def _run(self) -> None:
        start = time.monotonic()
        while not self.stop.is_set():
            with self.lock:
                ranks = list(self.ticks)
            for k, rank in enumerate(ranks):
                pause = start + k * self.interval / len(ranks) - time.monotonic()
                if pause > 0 and self.stop.wait(pause):
                    return
                with self.lock:  # a rank dropped meanwhile (gone silent) is not ticked again
                    tick = self.ticks.get(rank)
                    if tick is not None:
                        tick()
            start = max(start + self.interval, time.monotonic())


def _beats(clients: dict[int, Any], world: int, nproc: int, limit: float) -> dict[int, Any]:
    """Every rank's heartbeat (today's ``heartbeat`` takes none of the keywords)."""
    from idist._backends.native import _liveness

    params = inspect.signature(_liveness.heartbeat).parameters
    extra = {"prefix": "bench/live", "store_node": 0, "watch_main": False}
    kw = {k: v for k, v in extra.items() if k in params}
    fns = [
        lambda r=r, c=c: _liveness.heartbeat(c, simulated_rank(r, world, nproc), limit, **kw)
        for r, c in clients.items()
    ]
    return dict(zip(clients, _pooled(fns), strict=True))


def _watch(beat: Any, world: int, target: int, deadline: float) -> tuple[float, str] | None:
    """Ask ``lost()`` every interval, as a waiting collective does, until it names ``target``."""
    while time.monotonic() < deadline:
        lost = beat.lost(range(world))
        if lost is not None and target in lost.ranks:
            return time.monotonic(), str(lost.why)
        time.sleep(beat.interval)
    return None


def _joiner(store: Any, rank: int, world: int, nproc: int) -> Any:
    from idist._backends.native import _rendezvous

    info = simulated_rank(rank, world, nproc)
    return lambda: _rendezvous.join(store, info, TIMEOUT, "bench")


def worker(conn: Any, ranks: list[int], world: int, nproc: int, port: int, limit: float, cap: float) -> None:
    """One process's simulated ranks: each with its own connection, answering the parent's steps."""
    _raise_fd_limit()
    from torch._C._distributed_c10d import TCPStore

    made = _pooled([lambda: TCPStore("127.0.0.1", port, 1, False, timeout=TIMEOUT) for _ in ranks])
    clients = dict(zip(ranks, made, strict=True))
    beats: dict[int, Any] = {}
    driver: Driver | None = None
    conn.send("ready")
    while True:
        step, arg = conn.recv()
        if step == "join":
            out, took = _threads([_joiner(clients[r], r, world, nproc) for r in ranks], cap)
            conn.send((took, [repr(x) for x in out if x is not None][:3]))
        elif step == "beat":
            beats = _beats(clients, world, nproc, limit)
            driver = Driver(beats, min(1.0, max(0.05, limit / 10)))
            conn.send(len(beats))
        elif step == "silence":
            silent_at = time.monotonic()
            driver.drop(arg)
            beats[arg].stop()
            conn.send(silent_at)
        elif step == "watch":
            conn.send(_watch(beats[0], world, *arg))
        elif step == "stop":
            driver.stop.set()
            driver.thread.join()  # its tick in progress ends before the boards close
            for beat in beats.values():
                beat.stop()
            beats.clear()
            conn.send("stopped")
        elif step == "report":
            calls = [_reporter(clients[r], r, world) for r in ranks if r != arg]
            out, took = _threads(calls, cap)
            wrong = sorted({repr(m)[:80] for m in out if m != (arg,)})[:3]
            conn.send((took, sum(1 for m in out if m == (arg,)), len(out), wrong))
        elif step == "agree":
            out, took = _threads([_agreer(clients[r], r, world) for r in ranks], cap)
            errors = sorted({repr(v)[:80] for v in out if isinstance(v, Exception)})[:3]
            conn.send((took, sum(1 for v in out if v is None), len(out), errors))
        else:
            conn.send("bye")
            return


def measure(n: int, nproc: int, limit: float, window: float, cap: float, procs: int) -> dict[str, Any]:
    from torch._C._distributed_c10d import TCPStore

    listen = socket.create_server(("127.0.0.1", 0), backlog=16384)  # as idist serves it: IPv4, one address
    port = listen.getsockname()[1]
    server = TCPStore(
        "127.0.0.1",
        port,
        1,
        True,
        timeout=TIMEOUT,
        use_libuv=True,
        wait_for_workers=False,
        master_listen_fd=listen.detach(),
    )
    proxy = ProxyProcess(server.port)
    procs = max(min(2, -(-n // nproc)), min(procs, n // 128))
    nodes = -(-n // nproc)
    share = [list(range(w * nodes // procs * nproc, min(n, (w + 1) * nodes // procs * nproc))) for w in range(procs)]
    ctx = mp.get_context("spawn")
    pipes, workers = [], []
    for ranks in share:
        parent, child = ctx.Pipe()
        p = ctx.Process(target=worker, args=(child, ranks, n, nproc, proxy.port, limit, cap), daemon=True)
        p.start()
        pipes.append(parent)
        workers.append(p)
    try:
        for pipe in pipes:
            assert pipe.recv() == "ready"

        def ask(step: str, arg: object = None) -> list[Any]:
            for pipe in pipes:
                pipe.send((step, arg))
            return [pipe.recv() for pipe in pipes]

        row: dict[str, Any] = {"N": n, "liveness_limit_s": limit}
        proxy.reset()
        joined = ask("join")
        row["join_s"] = None if any(t is None for t, _ in joined) else round(max(t for t, _ in joined), 3)
        row["join_requests"] = proxy.stats()["requests"]
        errors = [e for _, es in joined for e in es]
        print(f"N={n}: join {row['join_s']} s, {row['join_requests']} requests {errors[:1] or ''}", flush=True)

        ask("beat")
        time.sleep(3 * min(1.0, limit / 10) + 2.0)  # every speaker and monitor settled
        proxy.reset()
        t0 = time.monotonic()
        time.sleep(window)
        got = proxy.stats()
        took = time.monotonic() - t0
        row["store_requests_per_s"] = round(got["requests"] / took, 1)
        row["store_keys_per_s"] = round(got["keys"] / took, 1)
        rate, keys = row["store_requests_per_s"], row["store_keys_per_s"]
        print(f"N={n}: steady {rate} requests/s, {keys} keys/s ({rate / n:.3f}, {keys / n:.3f} a rank)", flush=True)

        last = pipes[-1]
        last.send(("silence", n - 1))
        silent_at = last.recv()
        pipes[0].send(("watch", (n - 1, silent_at + limit + cap)))
        seen = pipes[0].recv()
        row["detect_s"] = round(seen[0] - silent_at, 2) if seen else None
        print(f"N={n}: rank {n - 1} silent, named after {row['detect_s']} s: {seen[1] if seen else ''}", flush=True)

        ask("stop")
        proxy.reset()
        reports = ask("report", n // 2)
        times = [t for t, _, _, _ in reports]
        right, total = sum(r for _, r, _, _ in reports), sum(k for _, _, k, _ in reports)
        wrong = sorted({w for *_, ws in reports for w in ws})[:3]
        diagnosis = None if any(t is None for t in times) else round(max(times), 2)
        print(f"N={n}: diagnosis {diagnosis} s, {proxy.stats()['requests']} requests, "
              f"{right} of {total} ranks named exactly rank {n // 2} {wrong or ''}", flush=True)  # fmt: skip
        got = proxy.stats()
        row["_diagnosis"] = {"seconds": diagnosis, "requests": got["requests"], "keys": got["keys"], "right": right}
        row["_diagnosis"]["of"] = total
        proxy.reset()
        agreed = ask("agree")
        got = proxy.stats()
        seconds = None if any(t is None for t, *_ in agreed) else round(max(t for t, *_ in agreed), 2)
        kept = sum(k for _, k, *_ in agreed)
        errors = sorted({e for *_, es in agreed for e in es})[:3]
        print(f"N={n}: the same bad input everywhere agreed in {seconds} s, {got['requests']} requests, "
              f"{got['keys']} keys; {kept} of {n} ranks kept the group {errors or ''}", flush=True)  # fmt: skip
        row["_agree"] = {"seconds": seconds, "requests": got["requests"], "keys": got["keys"], "kept": kept}
        ask("exit")
        return row
    finally:
        for p in workers:
            p.kill()
        proxy.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="64,1024,4096", help="comma-separated world sizes")
    ap.add_argument("--nproc", type=int, default=8, help="ranks per node (8 GPUs a node)")
    ap.add_argument("--limit", type=float, default=30.0, help="the liveness limit (idist's default: 30)")
    ap.add_argument("--window", type=float, default=10.0, help="seconds of steady state measured")
    ap.add_argument("--cap", type=float, default=180.0, help="seconds a phase may take before it is null")
    ap.add_argument("--procs", type=int, default=16, help="at most this many worker processes")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    _raise_fd_limit()
    rows = [measure(int(n), args.nproc, args.limit, args.window, args.cap, args.procs) for n in args.ranks.split(",")]
    extra = {k: [{"N": r["N"], **r.pop(f"_{k}")} for r in rows] for k in ("diagnosis", "agree")}
    if args.json is not None:
        args.json.write_text(json.dumps({"results": rows, **extra}, indent=1) + "\n")
        print(f"wrote {args.json}; diagnosis: {json.dumps(extra)}")


if __name__ == "__main__":
    main()
