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

``--output LINES`` measures the launcher's output path instead: 2 ranks each print LINES lines
of 80 bytes, one write per line (benchmarks/_burst.py, no torch), read from a pipe as fast as it
comes, with ``torchrun --standalone`` (raw: the ranks write to the pipe themselves) and
``idist run`` (every line read, prefixed with ``[rankN]:`` and passed on); the lines that
arrive are counted. ``--baseline-src DIR`` adds ``idist run`` of another checkout's ``src``
(``PYTHONPATH``), interleaved with the others: before and after a change, side by side.

Run: .venv/bin/python benchmarks/bench_launch.py [--rounds 7] [--output 100000 [--baseline-src DIR]]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
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


def _drained(cmd: list[str], env: dict[str, str], lines: int) -> None:
    """Run ``cmd`` with its stdout read as fast as it comes; check that every line arrived."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    count = [0]

    def read() -> None:
        assert proc.stdout is not None
        while chunk := proc.stdout.read1(1 << 20):
            count[0] += chunk.count(b"\n")

    reader = threading.Thread(target=read)
    reader.start()
    reader.join()
    if proc.wait() != 0 or count[0] != WORLD * lines:
        raise RuntimeError(f"{cmd[:4]}: status {proc.returncode}, {count[0]} of {WORLD * lines} lines")


def output_impls(lines: int, baseline_src: str | None) -> dict[str, Callable[[], None]]:
    """torchrun, idist run, and idist run of ``baseline_src``, each on benchmarks/_burst.py."""
    burst = [str(HERE / "_burst.py"), str(lines)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}", *burst]
    idist_run = [sys.executable, "-m", "idist", "run", "-n", str(WORLD), *burst]
    impls: dict[str, Callable[[], None]] = {
        "raw": lambda: _drained(torchrun, env, lines),
        "idist": lambda: _drained(idist_run, env, lines),
    }
    if baseline_src is not None:
        before = dict(env, PYTHONPATH=baseline_src)
        impls["baseline"] = lambda: _drained(idist_run, before, lines)
    return impls


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--skip-ignite", action="store_true", help="when pytorch-ignite is not installed")
    p.add_argument("--output", type=int, default=None, metavar="LINES", help="the output workload (see above)")
    p.add_argument("--baseline-src", default=None, metavar="DIR", help="with --output: also idist run from DIR")
    a = p.parse_args()
    impls: dict[str, Callable[[], None]] = {"raw": run_raw, "idist": run_idist}
    if a.output is not None:
        impls = output_impls(a.output, a.baseline_src)
    elif not a.skip_ignite:
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
    out: dict[str, object] = {"rounds": a.rounds, "world_size": WORLD, "output_lines": a.output, "seconds": times,
                              "summary": {}}  # fmt: skip
    print(f"\n{'impl':<8}{'median s':>10}{'ratio to raw (median of rounds)':>34}{'IQR':>18}")
    for name in names:
        ratios = [t / r for t, r in zip(times[name], times["raw"], strict=True)]
        lo, med, hi = _quartiles(ratios)
        median_s = statistics.median(times[name])
        out["summary"][name] = {"median_s": median_s, "ratio_median": med, "ratio_q1": lo, "ratio_q3": hi}  # type: ignore[index]
        print(f"{name:<8}{median_s:>10.3f}{med:>34.3f}{f'[{lo:.3f}, {hi:.3f}]':>18}")
    dest = HERE / "out"
    dest.mkdir(exist_ok=True)
    (dest / ("bench_launch_output.json" if a.output else "bench_launch.json")).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
