"""What the lane benchmarks (bench_horovod.py, bench_xla.py) share: their command-line
options, the Python values they exchange, their target tables and the end of a run.

A target table has one row per workload: raw and idist median per-call time, the median
and IQR of the per-round idist/raw ratio, the median per-round difference, the target and
whether the median meets it. Smoke runs print the same table with "-" in the target
column: they check that every workload runs and gives the right answer, never a speed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import _harness as h


def add_options(p: argparse.ArgumentParser, *, timeout: float, timeout_help: str) -> None:
    """The options both lane benchmarks take after their own: --only, --smoke, --profile, --timeout."""
    p.add_argument("--only", default="", help="only workloads whose name contains this")
    p.add_argument("--smoke", action="store_true", help="2 rounds, tiny sizes, no targets: does it run and agree?")
    p.add_argument("--profile", type=int, default=0, help="after timing, cProfile this many calls of each")
    p.add_argument("--timeout", type=float, default=timeout, help=timeout_help)


def opts(args: argparse.Namespace, *, smoke_warmup: int) -> dict[str, Any]:
    """What the ranks need of the command line; a smoke run: 2 rounds of at most 3 calls a batch."""
    return {
        "rounds": 2 if args.smoke else args.rounds, "warmup": smoke_warmup if args.smoke else args.warmup,
        "target_s": args.target_ms / 1e3, "max_inner": 3 if args.smoke else 2000, "only": args.only,
        "smoke": args.smoke, "profile": args.profile,
    }  # fmt: skip


def values(smoke: bool) -> dict[str, Callable[[int], object]]:
    """The Python values both lanes gather and broadcast: label -> the value of rank ``r``."""
    out: dict[str, Callable[[int], object]] = {
        "float": lambda r: 0.1 * (r + 1),
        "int": lambda r: 10**12 + r,
        "str[10]": lambda r: chr(ord("a") + r) * 10,
        "dict": lambda r: {"rank": r, "loss": 0.25 * r, "tag": "epoch-1"},
    }
    if not smoke:
        out["str[10_000]"] = lambda r: chr(ord("a") + r) * 10_000
    return out


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


def finish(name: str, payload: dict[str, Any], *, rounds: int, smoke: bool, failed: list[str], heading: str) -> int:
    """Write ``payload`` (``name``, or ``name-smoke``), print the closing line and what ``failed``.

    ``payload`` holds ``load_before``, ``load_after`` and ``wall_s``. Returns the exit
    status: 1 if anything failed (listed under ``bench_<name>: <heading>:`` on stderr).
    """
    path = h.write_json(f"{name}-smoke" if smoke else name, payload)
    print(f"rounds={rounds} (interleaved, order alternating); load average before {payload['load_before']}, "
          f"after {payload['load_after']}; wall {payload['wall_s']:.0f} s; JSON: {path}")  # fmt: skip
    if failed:
        print(f"bench_{name}: {heading}:\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    return 0


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
