"""Cost of checked collectives (``checked=True``) per call, on 2 gloo ranks.

One process launch, one context; each round runs every workload unchecked then checked
(the guard's flag flips between them), so both see the same group and machine noise.
Prints a table and writes benchmarks/out/checked.json.

    .venv/bin/python benchmarks/bench_checked.py [--rounds 15] [--calls 50]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.multiprocessing as mp

import idist

WORKLOADS: dict[str, Callable[[idist.NativeContext], object]] = {
    "all_reduce tensor 1": lambda ctx: ctx.all_reduce(torch.ones(1)),
    "all_reduce tensor 1M": lambda ctx: ctx.all_reduce(torch.ones(1_000_000)),
    "all_reduce float": lambda ctx: ctx.all_reduce(0.5),
    "all_gather tensor 1000": lambda ctx: ctx.all_gather(torch.ones(1000)),
    "broadcast str 10": lambda ctx: ctx.broadcast("0123456789" if ctx.rank == 0 else None),
    # a pickle: checked mode also confirms that every rank could load it (one more round)
    "broadcast dict": lambda ctx: ctx.broadcast({"step": 7, "lr": 0.1} if ctx.rank == 0 else None),
    "barrier": lambda ctx: ctx.barrier(),
}


def _time(ctx: idist.NativeContext, fn: Callable[[idist.NativeContext], object], calls: int) -> float:
    ctx.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn(ctx)
    return (time.perf_counter() - start) / calls


def _worker(rank: int, port: int, rounds: int, calls: int, out: str) -> None:
    ctx = idist.initialize("gloo", rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port)
    guard = ctx._state.world.guard
    results: dict[str, dict[str, list[float]]] = {k: {"plain": [], "checked": []} for k in WORKLOADS}
    for r in range(rounds + 2):  # two warm-up rounds
        for name, fn in WORKLOADS.items():
            for mode in ("plain", "checked"):
                guard.checked = mode == "checked"
                t = _time(ctx, fn, calls)
                if r >= 2:
                    results[name][mode].append(t)
    guard.checked = False
    idist.finalize()
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    out_dir = Path(__file__).parent / "out"
    out_dir.mkdir(exist_ok=True)
    raw = out_dir / "checked_raw.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.pop("IDIST_CHECKED", None)
    mp.spawn(_worker, args=(port, args.rounds, args.calls, str(raw)), nprocs=2, join=True)
    data = json.loads(raw.read_text())
    raw.unlink()
    rows = []
    print(f"{'workload':<24} {'plain µs':>10} {'checked µs':>11} {'+µs':>8} {'ratio':>6}  (IQR of ratio)")
    for name, modes in data.items():
        ratios = [c / p for p, c in zip(modes["plain"], modes["checked"], strict=True)]
        q = statistics.quantiles(ratios, n=4)
        plain, checked = statistics.median(modes["plain"]) * 1e6, statistics.median(modes["checked"]) * 1e6
        rows.append({"workload": name, "plain_us": plain, "checked_us": checked,
                     "ratio": statistics.median(ratios), "ratio_iqr": [q[0], q[2]]})  # fmt: skip
        print(f"{name:<24} {plain:>10.1f} {checked:>11.1f} {checked - plain:>8.1f} "
              f"{statistics.median(ratios):>6.2f}  ({q[0]:.2f}-{q[2]:.2f})")  # fmt: skip
    (out_dir / "checked.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
