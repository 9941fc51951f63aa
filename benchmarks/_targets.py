"""Target tables for the lane benchmarks (bench_horovod.py, bench_xla.py).

One row per workload: raw and idist median per-call time, the median and IQR of the
per-round idist/raw ratio, the median per-round difference, the target and whether the
median meets it. Smoke runs print the same table with "-" in the target column: they
check that every workload runs and gives the right answer, never a speed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import _harness as h


def load() -> str:
    """The machine's load averages, as ``uptime`` prints them (1, 5, 15 minutes)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def verdict(ratio: float, target: float | None) -> str:
    if target is None:
        return "-"
    return "met" if ratio <= target else "**missed**"


def table(title: str, rows: list[dict[str, Any]], *, smoke: bool) -> str:
    head = ["workload", "raw median", "idist median", "idist/raw median [IQR]", "idist-raw (µs)", "target", "met?"]
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        s = row["stats"]
        raw, ours = s["raw"], s["idist"]
        target = None if smoke else row.get("target")
        cells = [
            row["name"] + (f" ({'; '.join(f'{k}: {v}' for k, v in row['notes'].items())})" if row["notes"] else ""),
            h.fmt_time(raw["median_us"]),
            h.fmt_time(ours["median_us"]),
            f"{ours['ratio_median']:.2f}x [{ours['ratio_q1']:.2f}-{ours['ratio_q3']:.2f}]",
            h.fmt_diff(ours["diff_us_median"]),
            "-" if target is None else f"≤ {target:.2f}x",
            verdict(ours["ratio_median"], target),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def failures(rows: list[dict[str, Any]]) -> list[str]:
    """Workloads whose result was wrong (a note from the check): a smoke run fails on these."""
    return [f"{row['name']}: {row['notes']}" for row in rows if row["notes"]]


def profile(fn: Callable[[], object], calls: int, sync: Callable[[], None], top: int = 14) -> str:
    """cProfile of ``calls`` back-to-back calls of ``fn`` (after ``sync``): the top functions by own time."""
    import cProfile
    import io
    import pstats

    sync()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    text = out.getvalue()
    return text[text.find("   ncalls") :] if "   ncalls" in text else text


def profiles(rows: list[dict[str, Any]]) -> str:
    """The profiles stored in ``rows`` (``--profile``), one block per workload and implementation."""
    blocks = []
    for row in rows:
        for impl, text in row.get("profile", {}).items():
            blocks.append(f"--- profile: {row['name']}, {impl} ({row['profile_calls']} calls, rank 0)\n{text}")
    return "\n".join(blocks)
