"""Wall time of launch + initialize + one barrier + finalize for 2 gloo ranks on loopback.

Three implementations, interleaved in one run (the order rotates every round):

* raw    - ``torch.multiprocessing.spawn`` + ``init_process_group("gloo", tcp://...)``
           + ``barrier`` + ``destroy_process_group``, written by hand (free port);
* idist  - ``idist.spawn(fn, nprocs=2)``, ``fn`` calls ``idist.initialize()``,
           ``barrier()``, ``idist.finalize()``;
* ignite - pytorch-ignite 0.5.5 ``ignite.distributed.spawn("gloo", fn, (), nproc_per_node=2)``
           with ``fn`` doing ``barrier()`` (ignite initializes/finalizes around it).

Reports the median wall time of each and the median of the per-round ratios to raw (with
the interquartile range), and writes JSON to benchmarks/out/bench_launch.json.

Run: .venv/bin/python benchmarks/bench_launch.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch.multiprocessing as tmp  # noqa: E402

import _bench_launch_workers as workers  # noqa: E402
import idist  # noqa: E402

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_raw() -> None:
    tmp.spawn(workers.raw, args=(WORLD, _free_port()), nprocs=WORLD, join=True)


def run_idist() -> None:
    idist.spawn(workers.idist_mp_form, nprocs=WORLD)


def run_ignite() -> None:
    import ignite.distributed as ign

    # A free port: ignite's default (2222) would collide with any other job on the host.
    ign.spawn("gloo", workers.ignite, (), nproc_per_node=WORLD, master_port=_free_port())


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--skip-ignite", action="store_true", help="when pytorch-ignite is not installed")
    a = p.parse_args()
    impls: dict[str, Callable[[], None]] = {"raw": run_raw, "idist": run_idist}
    if not a.skip_ignite:
        impls["ignite"] = run_ignite
    names = list(impls)
    for name in names:  # warm-up: page cache, .pyc files
        impls[name]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(a.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            t0 = time.perf_counter()
            impls[name]()
            times[name].append(time.perf_counter() - t0)
        print(f"round {r + 1}/{a.rounds}: " + "  ".join(f"{n}={times[n][-1]:.3f}s" for n in names), flush=True)
    out: dict[str, object] = {"rounds": a.rounds, "world_size": WORLD, "seconds": times, "summary": {}}
    print(f"\n{'impl':<8}{'median s':>10}{'ratio to raw (median of rounds)':>34}{'IQR':>18}")
    for name in names:
        ratios = [t / r for t, r in zip(times[name], times["raw"], strict=True)]
        lo, med, hi = _quartiles(ratios)
        median_s = statistics.median(times[name])
        out["summary"][name] = {"median_s": median_s, "ratio_median": med, "ratio_q1": lo, "ratio_q3": hi}  # type: ignore[index]
        print(f"{name:<8}{median_s:>10.3f}{med:>34.3f}{f'[{lo:.3f}, {hi:.3f}]':>18}")
    dest = HERE / "out"
    dest.mkdir(exist_ok=True)
    (dest / "bench_launch.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
