"""Collectives per second through ``idist.testing`` at world size 4: simulated ranks
(threads in this process) against the same collectives on 4 real gloo processes.

Both worlds start once, in one launch of this script, and the rounds interleave them
(threads, processes; next round processes, threads), so each round's ratio compares runs
made moments apart. A run times ``--calls`` iterations of a mixed workload inside every
rank, from a barrier to the last rank's end; rate = collectives / slowest rank's time.
``simulate()`` end to end (creating and closing a world of 4 each call) is timed too.

    .venv/bin/python benchmarks/bench_simulate.py --rounds 7 --calls 200
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from idist import DistContext
from idist.testing import ProcessWorld, SimulatedWorld, simulate

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


def rate(times: list[float], calls: int) -> float:
    return calls * PER_ITERATION / max(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--world", type=int, default=4)
    args = ap.parse_args()
    n, calls = args.world, args.calls
    torch.set_num_threads(1)
    threads = SimulatedWorld(n, timeout=300)
    procs = ProcessWorld(n, timeout=300)
    procs.start()
    threads.run(workload, 5)
    procs.run(workload, 5)  # warm both
    rates: dict[str, list[float]] = {"threads": [], "processes": []}
    ratios: list[float] = []
    order = [("threads", threads), ("processes", procs)]
    try:
        for r in range(args.rounds):
            got: dict[str, float] = {}
            for name, world in order if r % 2 == 0 else order[::-1]:
                got[name] = rate(world.run(workload, calls), calls)
                rates[name].append(got[name])
            ratios.append(got["threads"] / got["processes"])
        e2e = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            simulate(n, workload, 1)
            e2e.append(time.perf_counter() - start)
    finally:
        threads.close()
        procs.close()
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(f"world size {n}, {calls} iterations x {PER_ITERATION} collectives per run, {args.rounds} rounds")
    print("| runner | median collectives/s | per collective |")
    print("|---|---|---|")
    for name in ("threads", "processes"):
        med = statistics.median(rates[name])
        print(f"| {name} | {med:,.0f} | {1e6 / med:.0f} µs |")
    print(f"threads/processes rate ratio: median {statistics.median(ratios):.2f}x (IQR {q[0]:.2f}-{q[2]:.2f})")
    e2e_ms = statistics.median(e2e) * 1e3
    print(f"simulate({n}, ...) end to end with 1 iteration (world set-up + close): median {e2e_ms:.1f} ms")


if __name__ == "__main__":
    main()
