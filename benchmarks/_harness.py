"""Shared benchmark machinery: spawn ranks, interleave implementations, summarise ratios.

Only ratios from interleaved runs mean anything on a noisy 2-core machine: every round
runs each implementation once (A, B, C; the next round starts one further along, B, C, A,
so that no implementation always runs first), and a round's ratio compares implementations
that ran milliseconds apart. Reported per implementation: the median per-call time over
rounds, and the median and interquartile range of the per-round ratio to the baseline
(plus the median per-round difference in microseconds, the "software overhead").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT_DIR = Path(__file__).resolve().parent / "out"

# Ranks run on the test suite's harness (spawned gloo processes, torchrun-style variables, a
# hard timeout): one implementation for both, and it does not go through idist's launchers.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from multiproc import free_port as free_port  # noqa: E402
from multiproc import run_ranks as run_ranks  # noqa: E402


# ------------------------------------------------------------ interleaving
@dataclass
class Workload:
    """One thing to measure: the same operation written by each implementation."""

    name: str
    impls: dict[str, Callable[[], object]]
    #: checks one result of an implementation before timing: (impl, result) -> error or None
    check: Callable[[str, object], str | None] | None = None
    #: called after the checks, before timing (e.g. zero the tensors so sums stay finite)
    reset: Callable[[], None] | None = None
    #: per-implementation notes (e.g. "n/a: ignite cannot gather variable shapes")
    notes: dict[str, str] = field(default_factory=dict)


def timed_batch(fn: Callable[[], object], inner: int, sync: Callable[[], None]) -> float:
    """Seconds per call over ``inner`` back-to-back calls, after a sync of all ranks."""
    sync()
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def interleave(
    impls: dict[str, Callable[[], object]],
    *,
    rounds: int,
    warmup: int,
    target_s: float,
    sync: Callable[[], None],
    agree: Callable[[int], int],
    max_inner: int = 2000,
) -> tuple[int, dict[str, list[float]]]:
    """Per-round per-call seconds for each implementation, run interleaved.

    ``agree(n)`` must return the same value on every rank (e.g. the max over ranks), so
    that all ranks make the same number of calls.
    """
    names = list(impls)
    for _ in range(warmup):  # first calls pay one-time costs (buffers, slot growth)
        for name in names:
            timed_batch(impls[name], 1, sync)
    # calibrate on a few warm calls, so that one batch of the slowest takes ~target_s
    inner = 1
    if max_inner > 1:
        slowest = max(timed_batch(impls[name], 3, sync) for name in names)
        inner = agree(max(1, min(max_inner, int(target_s / max(slowest, 1e-9)))))
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            times[name].append(timed_batch(impls[name], inner, sync))
    return inner, times


def check_and_reset(w: Workload) -> dict[str, str]:
    """Check each implementation's first result, then reset ``w`` for timing.

    Returns the notes: implementation -> what was wrong with its result.
    """
    notes: dict[str, str] = {}
    if w.check is not None:
        for impl, fn in w.impls.items():
            problem = w.check(impl, fn())
            if problem:
                notes[impl] = problem
    if w.reset is not None:
        w.reset()
    return notes


def quartiles(xs: Sequence[float]) -> tuple[float, float, float]:
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[1], q[2]


def summarise(times: dict[str, list[float]], baseline: str) -> dict[str, dict[str, float]]:
    """Median time per implementation and per-round ratios / differences to ``baseline``."""
    base = times[baseline]
    out: dict[str, dict[str, float]] = {}
    for name, ts in times.items():
        ratios = [t / b for t, b in zip(ts, base, strict=True)]
        diffs = [(t - b) * 1e6 for t, b in zip(ts, base, strict=True)]
        q1, med, q3 = quartiles(ratios)
        out[name] = {
            "median_us": statistics.median(ts) * 1e6,
            "ratio_median": med,
            "ratio_q1": q1,
            "ratio_q3": q3,
            "diff_us_median": statistics.median(diffs),
        }
    return out


# ------------------------------------------- ranks of torch.distributed's default group
def dist_sync() -> None:
    """The sync between timed batches on ranks of the default process group: a barrier."""
    import torch.distributed as dist

    dist.barrier()


def dist_agree(n: int) -> int:
    """The max of ``n`` over the ranks of the default process group (the same on every rank)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([n])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


# ----------------------------------------------------------------- command line
def parser(doc: str | None, *, target_ms: float) -> argparse.ArgumentParser:
    """A benchmark's command line with the options of every interleaved timing.

    ``--rounds``, ``--warmup`` and ``--target-ms`` (default ``target_ms``); the benchmark adds its own.
    """
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=21, help="interleaved rounds per workload")
    p.add_argument("--warmup", type=int, default=3, help="warm-up calls per implementation")
    p.add_argument("--target-ms", type=float, default=target_ms, help="wall time of one timed batch")
    return p


# ----------------------------------------------------------------- reporting
def fmt_time(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} µs"


def fmt_diff(us: float) -> str:
    sign = "+" if us >= 0 else "-"
    return sign + (fmt_time(abs(us)) if abs(us) >= 1e3 else f"{abs(us):.1f}")


def table(section: str, rows: list[dict[str, Any]], impls: Sequence[str], baseline: str) -> str:
    """A Markdown table: one row per workload, time and ratio-to-baseline per implementation."""
    head = ["workload", *[f"{i} median" for i in impls]]
    head += [f"{i}/{baseline} (IQR)" for i in impls if i != baseline]
    head += [f"{i}-{baseline} (µs)" for i in impls if i != baseline]
    head.append("notes")
    lines = [f"### {section}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        s = row["stats"]
        cells = [row["name"]]
        cells += [fmt_time(s[i]["median_us"]) if i in s else row["notes"].get(i, "n/a") for i in impls]
        for i in impls:
            if i == baseline:
                continue
            cells.append(
                f"{s[i]['ratio_median']:.2f}x ({s[i]['ratio_q1']:.2f}-{s[i]['ratio_q3']:.2f})" if i in s else "n/a"
            )
        for i in impls:
            if i == baseline:
                continue
            cells.append(fmt_diff(s[i]["diff_us_median"]) if i in s else "n/a")
        cells.append("; ".join(f"{i}: {note}" for i, note in row["notes"].items()))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    try:
        import ignite

        info["pytorch-ignite"] = ignite.__version__
    except ImportError:
        info["pytorch-ignite"] = None
    return info


def write_json(name: str, payload: dict[str, Any]) -> Path:
    OUT_DIR.mkdir(exist_ok=True)
    path = OUT_DIR / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str))
    return path
