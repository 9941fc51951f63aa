"""raw torch_xla (xm) vs idist on the XLA CPU device, side by side, and what each compiles.

    PJRT_DEVICE=CPU .venv-xla/bin/python benchmarks/bench_xla.py [--rounds 21] [--smoke]

Ranks are the 2 XLA CPU device threads of one process (``idist.testing._xla_world.XlaWorld``,
as the XLA lane runs them), each with its idist ``XlaContext``. Timing: one world; per
workload both implementations are checked and warmed up, then timed interleaved (see
``_harness``): each round runs raw and idist once as a batch of ~``--target-ms`` after the
threads meet on a ``threading.Barrier``, the order alternating from round to round.
Reported: median per-call time, median and IQR of the per-round idist/raw ratio, and the
target (tensors ≤ 1.05x, Python values ≤ 1.00x).

"raw" is the xm code that gives the same result (``_xla_workers.workloads``): a CPU tensor
moved to the device, a functional ``xm.all_reduce`` / ``xm.all_gather(pin_layout=False)``,
the programs run, the result back on the CPU; Python values through ``xm.mesh_reduce``'s
steps (``torch.save`` + ``xm.xla_rendezvous``'s gathers); a training step that averages the
gradients with one ``xm.all_reduce``. What raw code must avoid on this device (each never
meets, and XLA aborts the process), and why raw runs its syncs in rank order: see
``_xla_workers`` and benchmarks/RESULTS.md.

Compiles: two more fresh worlds, one running only raw, one only idist, every workload in
the same order ``--compile-calls`` times; torch_xla's ``CompileTime`` metric counts the
programs each call compiled (both threads). ``--smoke`` runs every workload for 2 rounds at
tiny sizes and fails only on a wrong result, a crash, or a program compiled after warm-up.
Prints Markdown tables; writes ``benchmarks/out/xla.json`` (``xla-smoke.json``).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("PJRT_DEVICE", "CPU")

import _harness as h
import _targets
import _xla_workers as xw

WORLD_SIZE = 2


def _world(timeout: float) -> Any:
    from idist.testing._xla_world import XlaWorld

    return XlaWorld(WORLD_SIZE, timeout=timeout)


def _timing(opts: dict[str, Any], timeout: float) -> list[dict[str, Any]]:
    world = _world(timeout)
    try:
        names: list[str] = world.run(xw.names, opts["smoke"])[0]
        rows = []
        for i, name in enumerate(names):
            if opts["only"] and opts["only"] not in name:
                continue
            print(f"  timing {name}", file=sys.stderr, flush=True)
            rows.append(world.run(xw.time_workload, i, opts)[0])
        return rows
    finally:
        world.close()


def _compiles(opts: dict[str, Any], timeout: float) -> list[dict[str, Any]]:
    """Per workload: the programs compiled by each call, raw and idist, each in a fresh world."""
    out: dict[str, dict[str, Any]] = {}
    for impl in ("raw", "idist"):
        world = _world(timeout)
        try:
            names: list[str] = world.run(xw.names, opts["smoke"])[0]
            for i, name in enumerate(names):
                if opts["only"] and opts["only"] not in name:
                    continue
                print(f"  compiles {impl}: {name}", file=sys.stderr, flush=True)
                counts = world.run(xw.count_compiles, impl, i, opts["compile_calls"], opts["smoke"])[0]
                out.setdefault(name, {"name": name})[impl] = counts
        finally:
            world.close()
    return list(out.values())


def _compile_table(rows: list[dict[str, Any]]) -> tuple[str, list[str]]:
    head = ["workload", "raw: programs per call", "idist: programs per call", "idist ≤ raw?", "nothing after warm-up?"]
    lines = ["### XLA programs compiled (torch_xla CompileTime count, both threads)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    problems = []
    tot_raw = tot_idist = 0
    for row in rows:
        raw, ours = row["raw"], row["idist"]
        tot_raw, tot_idist = tot_raw + sum(raw), tot_idist + sum(ours)
        le = sum(ours) <= sum(raw)
        # warm-up: the first call compiles; a byte exchange may settle its slot on the second
        steady = not any(ours[2:]) and not any(raw[2:])
        if not steady:
            problems.append(f"{row['name']}: compiled after warm-up (raw {raw}, idist {ours})")
        cells = [row["name"], str(raw), str(ours), "yes" if le else "**no**", "yes" if steady else "**no**"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"| **total** | {tot_raw} | {tot_idist} | {'yes' if tot_idist <= tot_raw else '**no**'} | |")
    return "\n".join(lines), problems


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = h.parser(__doc__, target_ms=20.0)
    p.add_argument("--compile-calls", type=int, default=4, help="calls per workload when counting compiles")
    p.add_argument("--no-compiles", action="store_true", help="skip the compile counts")
    p.add_argument("--no-timing", action="store_true", help="skip the timing")
    _targets.add_options(p, timeout=600.0, timeout_help="seconds one workload may take")
    args = p.parse_args(argv)
    opts = _targets.opts(args, smoke_warmup=2)
    opts["compile_calls"] = 3 if args.smoke else args.compile_calls
    started = time.monotonic()
    load_before = _targets.load()
    payload: dict[str, Any] = {"command": " ".join(["benchmarks/bench_xla.py", *argv]),
                               "environment": h.environment(), "load_before": load_before}  # fmt: skip
    failed: list[str] = []
    if not args.no_timing:
        rows = _timing(opts, args.timeout)
        payload["timing"] = rows
        title = "XLA CPU device, 2 device threads (PJRT_DEVICE=CPU)" + (
            " — smoke run, no targets" if args.smoke else ""
        )
        print(_targets.table(title, rows, smoke=args.smoke), "\n", flush=True)
        if args.profile:
            print(_targets.profiles(rows), flush=True)
        failed += _targets.failures(rows)
    if not args.no_compiles:
        crow = _compiles(opts, args.timeout)
        payload["compiles"] = crow
        text, problems = _compile_table(crow)
        print(text, "\n", flush=True)
        failed += problems
    payload["load_after"] = _targets.load()
    payload["wall_s"] = time.monotonic() - started
    return _targets.finish("xla", payload, rounds=opts["rounds"], smoke=args.smoke, failed=failed, heading="failed")


if __name__ == "__main__":
    raise SystemExit(main())
