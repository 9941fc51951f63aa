"""raw horovod.torch vs idist on Horovod, side by side in one launch.

    .venv-horovod/bin/python benchmarks/bench_horovod.py [--rounds 21] [--smoke]

Starts ``horovodrun -np 2 -H localhost:2 --gloo`` once on this script. Every rank calls
``hvd.init()`` itself and idist adopts that runtime (``idist.current()``), so raw Horovod
and idist share one Horovod runtime and run interleaved (see ``_harness``): each round
runs raw and idist once as a batch of ~``--target-ms``, after an ``hvd.barrier()``, the
order alternating from round to round. Each implementation's first result is checked
before timing. Reported: median per-call time, median and IQR of the per-round idist/raw
ratio, and the target (tensors ≤ 1.05x, Python values ≤ 1.00x).

"raw" is horovod.torch written the straightforward way: ``hvd.allreduce_`` (in place, same
op), ``hvd.allgather`` (which concatenates; the rows are split back per rank, and for
shapes that differ by rank the rows per rank are gathered first, as a caller who wants
each rank's tensor must), ``hvd.broadcast_`` into same-shape receivers,
``hvd.allgather_object`` / ``hvd.broadcast_object`` for Python values (receivers pass
``None``), and ``hvd.allreduce`` of a float64 / int64 scalar tensor + ``item()`` for a
Python number's sum. ``--smoke`` runs every workload for 2 rounds at tiny sizes and fails
only on a wrong result or a crash. Prints a Markdown table; writes
``benchmarks/out/horovod.json`` (``horovod-smoke.json`` for a smoke run).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness as h
import _targets

TENSOR_TARGET = 1.05
VALUE_TARGET = 1.00
RAW_AND_IDIST = ("raw", "idist")


# ------------------------------------------------------------------ workloads
def _workloads(rank: int, ws: int, smoke: bool) -> list[tuple[h.Workload, float]]:
    import horovod.torch as hvd
    import torch

    import idist

    out: list[tuple[h.Workload, float]] = []

    def add(w: h.Workload, target: float) -> None:
        out.append((w, target))

    isum = ws * (ws + 1) // 2

    # ---- tensor all_reduce, in place: checked with rank+1 everywhere, then timed on zeros
    sizes = (1, 1_000) if smoke else (1, 1_000, 64_000, 1_000_000, 16_000_000)
    for n in sizes:
        ts = {i: torch.full((n,), float(rank + 1)) for i in RAW_AND_IDIST}

        def reset(ts: dict[str, torch.Tensor] = ts) -> None:
            for t in ts.values():
                t.zero_()

        def check_sum(_: str, v: object, n: int = n) -> str | None:
            ok = isinstance(v, torch.Tensor) and v.shape == (n,) and bool((v == isum).all())
            return None if ok else f"wrong sum {v!r}"[:200]

        add(h.Workload(
            f"all_reduce(tensor[{n:_}])",
            {"raw": lambda t=ts["raw"]: hvd.allreduce_(t, op=hvd.Sum),
             "idist": lambda t=ts["idist"]: idist.all_reduce(t)},
            check=check_sum, reset=reset,
        ), TENSOR_TARGET)  # fmt: skip

    # ---- all_gather of equal shapes: Horovod concatenates, idist gives one tensor per rank
    for n in (1_000,) if smoke else (1_000, 1_000_000):
        t = torch.full((n,), float(rank))

        def raw_gather(t: torch.Tensor = t) -> list[torch.Tensor]:
            return list(hvd.allgather(t).chunk(ws))

        def check_gather(_: str, v: object, n: int = n) -> str | None:
            ok = isinstance(v, list) and len(v) == ws
            ok = ok and all(x.shape == (n,) and bool((x == k).all()) for k, x in enumerate(v))
            return None if ok else "wrong gather"

        add(h.Workload(
            f"all_gather(tensor[{n:_}])",
            {"raw": raw_gather, "idist": lambda t=t: idist.all_gather(t)}, check=check_gather,
        ), TENSOR_TARGET)  # fmt: skip

    # ---- all_gather of shapes that differ by rank (first dimension: all Horovod can)
    for rows, cols in ((100, 10),) if smoke else ((100, 10), (10_000, 100)):
        tvar = torch.full((rows + 10 * rank, cols), float(rank))

        def raw_ragged(t: torch.Tensor = tvar) -> list[torch.Tensor]:
            # a caller who wants each rank's tensor needs the row counts: one more allgather
            counts = hvd.allgather(torch.tensor([t.shape[0]]))
            return list(hvd.allgather(t).split(counts.tolist()))

        def raw_ragged_known(t: torch.Tensor = tvar, rows: int = rows) -> list[torch.Tensor]:
            # the lower bound: every rank already knows every rank's row count
            return list(hvd.allgather(t).split([rows + 10 * k for k in range(ws)]))

        def check_var(_: str, v: object, rows: int = rows, cols: int = cols) -> str | None:
            ok = isinstance(v, list) and [tuple(x.shape) for x in v] == [(rows + 10 * k, cols) for k in range(ws)]
            ok = ok and all(bool((x == k).all()) for k, x in enumerate(v))
            return None if ok else "wrong gather"

        shape = f"[{rows}+10r, {cols}]"
        add(h.Workload(
            f"all_gather(tensor{shape}, shapes differ)",
            {"raw": raw_ragged, "idist": lambda t=tvar: idist.all_gather(t)}, check=check_var,
        ), TENSOR_TARGET)  # fmt: skip
        add(h.Workload(
            f"all_gather(tensor{shape}, shapes differ; raw knows them)",
            {"raw": raw_ragged_known, "idist": lambda t=tvar: idist.all_gather(t)}, check=check_var,
        ), TENSOR_TARGET)  # fmt: skip

    # ---- tensor broadcast into same-shape receivers
    for n in (1_000,) if smoke else (1_000, 64_000, 1_000_000):
        src_vals = torch.arange(n, dtype=torch.float32)
        tb = {i: src_vals.clone() if rank == 0 else torch.zeros(n) for i in RAW_AND_IDIST}

        def check_bcast(_: str, v: object, src_vals: torch.Tensor = src_vals) -> str | None:
            return None if isinstance(v, torch.Tensor) and torch.equal(v, src_vals) else "wrong broadcast"

        add(h.Workload(
            f"broadcast(tensor[{n:_}])",
            {"raw": lambda t=tb["raw"]: hvd.broadcast_(t, root_rank=0),
             "idist": lambda t=tb["idist"]: idist.broadcast(t, src=0)},
            check=check_bcast,
        ), TENSOR_TARGET)  # fmt: skip

    # ---- Python values
    def raw_sum_float(x: float) -> float:
        return float(hvd.allreduce(torch.tensor(x, dtype=torch.float64), op=hvd.Sum).item())

    def raw_sum_int(x: int) -> int:
        return int(hvd.allreduce(torch.tensor(x, dtype=torch.int64), op=hvd.Sum).item())

    fsum = sum(0.1 * (k + 1) for k in range(ws))
    add(h.Workload(
        "all_reduce(float)",
        {"raw": lambda: raw_sum_float(0.1 * (rank + 1)), "idist": lambda: idist.all_reduce(0.1 * (rank + 1))},
        check=lambda _, v: None if isinstance(v, float) and abs(v - fsum) < 1e-12 else f"got {v!r}",
    ), VALUE_TARGET)  # fmt: skip
    add(h.Workload(
        "all_reduce(int)",
        {"raw": lambda: raw_sum_int(rank + 1), "idist": lambda: idist.all_reduce(rank + 1)},
        check=lambda _, v: None if v == isum and type(v) is int else f"got {v!r}",
    ), VALUE_TARGET)  # fmt: skip

    values = _targets.values(smoke)
    for label, make in values.items():
        mine, expect = make(rank), [make(k) for k in range(ws)]
        add(h.Workload(
            f"all_gather({label})",
            {"raw": lambda x=mine: hvd.allgather_object(x), "idist": lambda x=mine: idist.all_gather(x)},
            check=lambda _, v, e=expect: None if v == e else f"got {v!r}"[:200],
        ), VALUE_TARGET)  # fmt: skip
    for label, make in values.items():
        want = make(0)
        mine = want if rank == 0 else None
        add(h.Workload(
            f"broadcast({label}), None receivers",
            # name= on every rank: Horovod's default name is type(obj).__name__, "NoneType" on
            # the receivers, and ranks whose names differ never meet
            {"raw": lambda x=mine: hvd.broadcast_object(x, root_rank=0, name="bench.object"),
             "idist": lambda x=mine: idist.broadcast(x, src=0)},
            check=lambda _, v, w=want: None if v == w and type(v) is type(w) else f"got {v!r}"[:200],
        ), VALUE_TARGET)  # fmt: skip

    add(h.Workload("barrier", {"raw": hvd.barrier, "idist": idist.barrier}), TENSOR_TARGET)
    return out


def rank_main(opts: dict[str, Any]) -> list[dict[str, Any]]:
    """One Horovod rank: every workload, interleaved; the rows (rank 0's are reported)."""
    import horovod.torch as hvd
    import torch

    torch.set_num_threads(1)  # 2 ranks on 2 cores: one intra-op thread each, for raw and idist alike
    hvd.init()
    try:
        import idist

        ctx = idist.current()  # adopts the Horovod runtime we just started
        assert ctx.backend == "horovod" and ctx.world_size == hvd.size(), ctx
        rank, ws = hvd.rank(), hvd.size()

        def agree(n: int) -> int:
            return int(hvd.allreduce(torch.tensor([n]), op=hvd.Max).item())

        rows = []
        for w, target in _workloads(rank, ws, opts["smoke"]):
            if opts["only"] and opts["only"] not in w.name:
                continue
            print(f"[rank {rank}] {w.name}", file=sys.stderr, flush=True)  # shown when the launch fails
            notes = h.check_and_reset(w)
            inner, times = h.interleave(
                w.impls, rounds=opts["rounds"], warmup=opts["warmup"], target_s=opts["target_s"],
                sync=hvd.barrier, agree=agree, max_inner=opts["max_inner"],
            )  # fmt: skip
            row = {
                "name": w.name, "inner": inner, "notes": notes, "target": target, "times_s": times,
                "stats": h.summarise(times, "raw"),
            }  # fmt: skip
            if opts["profile"]:
                row["profile_calls"] = opts["profile"]
                row["profile"] = {i: _targets.profile(fn, opts["profile"], hvd.barrier) for i, fn in w.impls.items()}
            rows.append(row)
        return rows
    finally:
        hvd.shutdown()


def _rank_entry(opts_path: str, out_path: str) -> int:
    opts = json.loads(Path(opts_path).read_text())
    rows = rank_main(opts)
    if os.environ.get("HOROVOD_RANK", "0") == "0":
        Path(out_path).write_text(json.dumps(rows))
    return 0


# -------------------------------------------------------------------- parent
def _horovodrun(opts: dict[str, Any], np: int, timeout: float) -> list[dict[str, Any]]:
    horovodrun = Path(sys.executable).parent / "horovodrun"
    with tempfile.TemporaryDirectory(prefix="idist-bench-hvd-") as tmp:
        opts_path, out_path = Path(tmp) / "opts.json", Path(tmp) / "rows.json"
        opts_path.write_text(json.dumps(opts))
        cmd = [
            str(horovodrun), "-np", str(np), "-H", f"localhost:{np}", "--gloo",
            sys.executable, os.path.abspath(__file__), "--rank-entry", str(opts_path), str(out_path),
        ]  # fmt: skip
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            msg = f"bench_horovod: horovodrun did not finish within {timeout:.0f} s:\n{output[-4000:]}"
            raise SystemExit(msg) from None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # nothing horovodrun started outlives the run
            except ProcessLookupError:
                pass
        if proc.returncode != 0 or not out_path.exists():
            raise SystemExit(f"bench_horovod: horovodrun exited with {proc.returncode}:\n{output[-6000:]}")
        rows: list[dict[str, Any]] = json.loads(out_path.read_text())
        return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--rank-entry"]:
        return _rank_entry(argv[1], argv[2])
    # Horovod ops take milliseconds and jitter by a cycle (HOROVOD_CYCLE_TIME): batches of
    # many calls, so that a round's ratio compares averages, not single calls
    p = h.parser(__doc__, target_ms=150.0)
    _targets.add_options(p, timeout=1800.0, timeout_help="seconds before the launch is killed")
    args = p.parse_args(argv)
    opts = _targets.opts(args, smoke_warmup=1)
    started = time.monotonic()
    load_before = _targets.load()
    rows = _horovodrun(opts, 2, 300.0 if args.smoke else args.timeout)
    wall = time.monotonic() - started
    title = "Horovod, 2 ranks (horovodrun --gloo, loopback, CPU)" + (" — smoke run, no targets" if args.smoke else "")
    print(_targets.table(title, rows, smoke=args.smoke), "\n", flush=True)
    if args.profile:
        print(_targets.profiles(rows), flush=True)
    payload = {
        "command": " ".join(["benchmarks/bench_horovod.py", *argv]), "environment": h.environment(),
        "load_before": load_before, "load_after": _targets.load(), "wall_s": wall, "rows": rows,
    }  # fmt: skip
    failed = _targets.failures(rows)
    return _targets.finish(
        "horovod", payload, rounds=opts["rounds"], smoke=args.smoke, failed=failed, heading="wrong results"
    )


if __name__ == "__main__":
    raise SystemExit(main())
