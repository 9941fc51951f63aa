"""``idist.testing`` costs: simulated ranks against processes, what one ``simulate()`` costs
end to end (successful and failing), and simulated worlds of many ranks.

1. Collectives per second at ``--world`` ranks: simulated ranks (threads in this process)
   against the same collectives on as many real gloo processes. Both worlds start once, in one
   launch of this script, and the rounds interleave them (threads, processes; next round
   processes, threads), so each round's ratio compares runs made moments apart. A run times
   ``--calls`` iterations of a mixed workload inside every rank, from a barrier to the last
   rank's end; rate = collectives / slowest rank's time. ``--calls 0`` skips this part.
2. ``simulate(2, fn)`` end to end (world set-up, one all_reduce, close), median of ``--e2e``
   calls; and a failing run (one rank raises while the other waits in a collective).
3. ``simulate(N, fn)`` end to end for each N of ``--ranks`` (an all_reduce, an all_gather, a
   broadcast and a barrier, checked mode on), median of 3, with the file descriptors it used.

    .venv/bin/python benchmarks/bench_simulate.py --rounds 7 --calls 200 --e2e 50 --ranks 64,256
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from idist import DistContext
from idist.testing import ProcessWorld, RankFailedError, SimulatedWorld, simulate

#: collectives per workload iteration
PER_ITERATION = 5


def workload(ctx: DistContext, calls: int) -> float:
    """``calls`` iterations of five collectives; returns this rank's seconds."""
    t = torch.ones(256)
    ctx.barrier()
    start = time.perf_counter()
    for i in range(calls):
        ctx.all_reduce(t)  # tensor, 1 KiB
        ctx.all_reduce(float(i))  # Python number, exact
        ctx.all_gather(ctx.rank)  # Python value
        ctx.broadcast("héllo" if ctx.rank == 0 else None)  # str
        ctx.barrier()
    return time.perf_counter() - start


def one_call(ctx: DistContext) -> int:
    return ctx.all_reduce(ctx.rank)


def fail_one(ctx: DistContext) -> int:
    if ctx.rank == 1:
        raise KeyError("rank 1")
    return ctx.all_reduce(1)


def probe(ctx: DistContext) -> tuple[int, int, float, int]:
    fds = len(os.listdir("/proc/self/fd")) if ctx.rank == 0 else 0
    b = ctx.broadcast(torch.ones(4) if ctx.rank == 0 else None, src=0)
    out = (ctx.all_reduce(ctx.rank), len(ctx.all_gather(ctx.rank)), b.sum().item(), fds)
    ctx.barrier()
    return out


def rate(times: list[float], calls: int) -> float:
    return calls * PER_ITERATION / max(times)


def compare(n: int, calls: int, rounds: int) -> None:
    threads = SimulatedWorld(n, timeout=300)
    procs = ProcessWorld(n, timeout=300)
    procs.start()
    threads.run(workload, 5)
    procs.run(workload, 5)  # warm both
    rates: dict[str, list[float]] = {"threads": [], "processes": []}
    ratios: list[float] = []
    order = [("threads", threads), ("processes", procs)]
    try:
        for r in range(rounds):
            got: dict[str, float] = {}
            for name, world in order if r % 2 == 0 else order[::-1]:
                got[name] = rate(world.run(workload, calls), calls)
                rates[name].append(got[name])
            ratios.append(got["threads"] / got["processes"])
    finally:
        threads.close()
        procs.close()
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(f"world size {n}, {calls} iterations x {PER_ITERATION} collectives per run, {rounds} rounds")
    print("| runner | median collectives/s | per collective |")
    print("|---|---|---|")
    for name in ("threads", "processes"):
        med = statistics.median(rates[name])
        print(f"| {name} | {med:,.0f} | {1e6 / med:.0f} µs |")
    print(f"threads/processes rate ratio: median {statistics.median(ratios):.2f}x (IQR {q[0]:.2f}-{q[2]:.2f})")


def end_to_end(runs: int) -> None:
    ok, failing = [], []
    for _ in range(runs):
        start = time.perf_counter()
        simulate(2, one_call)
        ok.append(time.perf_counter() - start)
        start = time.perf_counter()
        try:
            simulate(2, fail_one)
        except RankFailedError:
            failing.append(time.perf_counter() - start)
    q = statistics.quantiles(ok, n=4)
    print(
        f"simulate(2, fn) end to end, {runs} calls: median {statistics.median(ok) * 1e3:.1f} ms "
        f"(IQR {q[0] * 1e3:.1f}-{q[2] * 1e3:.1f})"
    )
    print(f"a failing simulate(2, fn) (one rank raises, one waits): median {statistics.median(failing) * 1e3:.1f} ms")


def many(sizes: list[int]) -> None:
    print("| ranks | simulate(N, fn) end to end | file descriptors open in the run |")
    print("|---|---|---|")
    for n in sizes:
        times, fds = [], 0
        for _ in range(3):
            start = time.perf_counter()
            fds = simulate(n, probe)[0][3]
            times.append(time.perf_counter() - start)
        print(f"| {n} | {statistics.median(times):.2f} s | {fds} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--e2e", type=int, default=50)
    ap.add_argument("--ranks", default="64")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.calls:
        compare(args.world, args.calls, args.rounds)
    if args.e2e:
        end_to_end(args.e2e)
    sizes = [int(s) for s in args.ranks.split(",") if s.strip()]
    if sizes:
        many(sizes)


if __name__ == "__main__":
    main()
