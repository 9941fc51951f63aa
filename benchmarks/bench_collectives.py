"""raw torch.distributed vs pytorch-ignite's ignite.distributed vs idist, side by side.

    .venv/bin/python benchmarks/bench_collectives.py [--rounds 21] [--world-sizes 2,1]

Every rank initializes torch's default gloo group by hand; ignite adopts it (its lazy
sync) and idist adopts it through ``idist.current()``, so the three implementations share
one process group in one process launch and run interleaved (see ``_harness``). "raw" is
torch.distributed written the straightforward way. 2 ranks measure the real thing, 1 rank
the pure software overhead. The launch workload (spawn 2 ranks + init + barrier +
finalize) runs from this parent process. Prints Markdown tables; writes
``benchmarks/out/collectives.json``.

Each implementation's first result is checked against the expected value before timing;
a wrong or inexact result is reported in the table (ignite broadcasts Python floats
through float32), never silently timed.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness as h
import _launch_workers as lw

IMPLS = ("raw", "ignite", "idist")


# ------------------------------------------------------------------ workloads
def _workloads(rank: int, ws: int) -> list[h.Workload]:
    import ignite.distributed as ign
    import torch
    import torch.distributed as dist

    import idist

    out: list[h.Workload] = []
    add = out.append

    # barrier
    add(h.Workload("barrier", {"raw": dist.barrier, "ignite": ign.barrier, "idist": idist.barrier}))

    # Python numbers
    def raw_float(x: float = 0.1 * (rank + 1)) -> float:
        t = torch.tensor(x, dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())

    def raw_int(x: int = rank + 1) -> int:
        t = torch.tensor(x)
        dist.all_reduce(t)
        return int(t.item())

    fsum = math.fsum(0.1 * (k + 1) for k in range(ws))
    isum = ws * (ws + 1) // 2
    add(h.Workload(
        "all_reduce(float)",
        {"raw": raw_float, "ignite": lambda: ign.all_reduce(0.1 * (rank + 1)),
         "idist": lambda: idist.all_reduce(0.1 * (rank + 1))},
        check=lambda _, v: None if isinstance(v, float) and abs(v - fsum) < 1e-12 else f"got {v!r}",
    ))  # fmt: skip
    add(h.Workload(
        "all_reduce(int)",
        {"raw": raw_int, "ignite": lambda: ign.all_reduce(rank + 1), "idist": lambda: idist.all_reduce(rank + 1)},
        check=lambda _, v: None if v == isum and type(v) is int else f"got {v!r}",
    ))  # fmt: skip

    # tensor all_reduce: checked once with rank+1 everywhere, then timed on zeros
    for n in (1, 1_000, 1_000_000, 16_000_000):
        ts = {i: torch.full((n,), float(rank + 1)) for i in IMPLS}

        def reset(ts: dict[str, torch.Tensor] = ts) -> None:
            for t in ts.values():
                t.zero_()

        def check_sum(impl: str, v: object, n: int = n) -> str | None:
            ok = isinstance(v, torch.Tensor) and v.shape == (n,) and bool((v == isum).all())
            return None if ok else "wrong sum"

        add(h.Workload(
            f"all_reduce(tensor[{n:_}])",
            {"raw": lambda t=ts["raw"]: dist.all_reduce(t) or t,
             "ignite": lambda t=ts["ignite"]: ign.all_reduce(t),
             "idist": lambda t=ts["idist"]: idist.all_reduce(t)},
            check=check_sum, reset=reset,
        ))  # fmt: skip

    # all_gather of a 1000-element tensor
    t1k = torch.full((1000,), float(rank))
    expect_1k = [[float(k)] * 1000 for k in range(ws)]

    def raw_gather(t: torch.Tensor = t1k) -> list[torch.Tensor]:
        outs = [torch.empty_like(t) for _ in range(ws)]
        dist.all_gather(outs, t)
        return outs

    def as_rows(v: object) -> list[list[float]]:
        if isinstance(v, torch.Tensor):  # ignite concatenates
            return [x.tolist() for x in v.reshape(ws, -1)]
        return [x.tolist() for x in v]  # type: ignore[attr-defined]

    add(h.Workload(
        "all_gather(tensor[1_000])",
        {"raw": raw_gather, "ignite": lambda: ign.all_gather(t1k), "idist": lambda: idist.all_gather(t1k)},
        check=lambda _, v: None if as_rows(v) == expect_1k else "wrong gather",
    ))  # fmt: skip

    # all_gather of tensors whose first dimension differs by rank
    tvar = torch.full((100 + 10 * rank, 10), float(rank))

    def raw_gather_var(t: torch.Tensor = tvar) -> list[torch.Tensor]:
        shape = torch.tensor(t.shape)
        shapes = [torch.empty_like(shape) for _ in range(ws)]
        dist.all_gather(shapes, shape)
        rows = [int(s[0]) for s in shapes]
        padded = torch.zeros((max(rows), *t.shape[1:]), dtype=t.dtype)
        padded[: t.shape[0]] = t
        outs = [torch.empty_like(padded) for _ in range(ws)]
        dist.all_gather(outs, padded)
        return [o[:r] for o, r in zip(outs, rows, strict=True)]

    def ignite_gather_var(t: torch.Tensor = tvar) -> list[torch.Tensor]:
        shapes = ign.all_gather(torch.tensor(t.shape).unsqueeze(0))
        return ign.all_gather_tensors_with_shapes(t, shapes.tolist())  # type: ignore[union-attr]

    def check_var(_: str, v: object) -> str | None:
        ok = [tuple(x.shape) for x in v] == [(100 + 10 * k, 10) for k in range(ws)]  # type: ignore[attr-defined]
        ok = ok and all(bool((x == k).all()) for k, x in enumerate(v))  # type: ignore[arg-type]
        return None if ok else "wrong gather"

    add(h.Workload(
        "all_gather(tensor, shapes differ)",
        {"raw": raw_gather_var, "ignite": ignite_gather_var, "idist": lambda: idist.all_gather(tvar)},
        check=check_var,
    ))  # fmt: skip

    # all_gather of Python values
    def raw_gather_obj(x: object) -> list[object]:
        outs: list[object] = [None] * ws
        dist.all_gather_object(outs, x)
        return outs

    for n in (10, 10_000):
        s = chr(ord("a") + rank) * n
        expect_s = [chr(ord("a") + k) * n for k in range(ws)]
        add(h.Workload(
            f"all_gather(str[{n:_}])",
            {"raw": lambda s=s: raw_gather_obj(s), "ignite": lambda s=s: ign.all_gather(s),
             "idist": lambda s=s: idist.all_gather(s)},
            check=lambda _, v, e=expect_s: None if v == e else "wrong gather",
        ))  # fmt: skip
    d = {"rank": rank, "loss": 0.25 * rank, "tag": "epoch-1"}
    expect_d = [{"rank": k, "loss": 0.25 * k, "tag": "epoch-1"} for k in range(ws)]
    add(h.Workload(
        "all_gather(dict)",
        {"raw": lambda: raw_gather_obj(d), "ignite": lambda: ign.all_gather(d), "idist": lambda: idist.all_gather(d)},
        check=lambda _, v: None if v == expect_d else "wrong gather",
    ))  # fmt: skip

    # broadcast of a Python float, receivers pass None
    mine = 0.1 if rank == 0 else None

    def raw_bcast_obj(mine: object = mine) -> object:
        box = [mine]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    add(h.Workload(
        "broadcast(float), None receivers",
        {"raw": lambda: raw_bcast_obj(), "ignite": lambda: ign.broadcast(mine, src=0, safe_mode=True),
         "idist": lambda: idist.broadcast(mine, src=0)},
        check=lambda _, v: None if v == 0.1 and type(v) is float else f"inexact: got {v!r}",
    ))  # fmt: skip

    # broadcast of a dict (a pickle), receivers pass None
    mine_d = {"step": 7, "lr": 0.1, "tag": "epoch-1"} if rank == 0 else None
    add(h.Workload(
        "broadcast(dict), None receivers",
        {"raw": lambda: raw_bcast_obj(mine_d), "idist": lambda: idist.broadcast(mine_d, src=0)},
        check=lambda _, v: None if v == {"step": 7, "lr": 0.1, "tag": "epoch-1"} else f"wrong: got {v!r}",
        notes={"ignite": "n/a: ignite broadcasts tensors, numbers and str only"},
    ))  # fmt: skip

    # tensor broadcast into same-shape receivers: 64 KiB (the smallest sent apart from its
    # header), 256 KiB and 4 MB of float32
    for n in (16_384, 65_536, 1_000_000):
        src_vals = torch.arange(n, dtype=torch.float32)
        tb = {i: src_vals.clone() if rank == 0 else torch.zeros(n) for i in IMPLS}
        add(h.Workload(
            f"broadcast(tensor[{n:_}])",
            {"raw": lambda t=tb["raw"]: dist.broadcast(t, 0) or t,
             "ignite": lambda t=tb["ignite"]: ign.broadcast(t, src=0),
             "idist": lambda t=tb["idist"]: idist.broadcast(t, src=0)},
            check=lambda _, v, e=src_vals: None if isinstance(v, torch.Tensor) and torch.equal(v, e) else "wrong",
        ))  # fmt: skip
    return out


def _rank_main(rank: int, ws: int, rounds: int, warmup: int, target_s: float, only: str) -> list[dict[str, Any]]:
    import warnings

    import torch.distributed as dist

    # ignite's all_gather_tensors_with_shapes indexes with a list (deprecated in torch 2.9+)
    warnings.filterwarnings("ignore", message="Using a non-tuple sequence", category=UserWarning)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank, world_size=ws
    )
    try:
        import ignite.distributed as ign

        import idist

        # both wrappers adopt the group we just made
        assert ign.get_world_size() == ws and ign.backend() == "gloo"
        assert idist.current().world_size == ws and idist.current().backend == "gloo"

        rows = []
        for w in _workloads(rank, ws):
            if only and only not in w.name:
                continue
            notes = h.check_and_reset(w)
            inner, times = h.interleave(
                w.impls, rounds=rounds, warmup=warmup, target_s=target_s, sync=h.dist_sync, agree=h.dist_agree
            )
            rows.append({
                "name": w.name, "inner": inner, "notes": notes, "times_s": times,
                "stats": h.summarise(times, "raw"),
            })  # fmt: skip
        return rows
    finally:
        dist.destroy_process_group()


# -------------------------------------------------------------------- launch
def _launch_impls(world_size: int) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    import ignite.distributed as ign
    import torch.multiprocessing as tmp

    import idist

    notes: dict[str, str] = {}

    def raw() -> None:
        tmp.spawn(lw.raw_worker, args=(world_size, h.free_port()), nprocs=world_size, join=True)

    def ignite() -> None:
        with ign.Parallel(backend="gloo", nproc_per_node=world_size, master_port=h.free_port()) as p:
            p.run(lw.ignite_worker)

    spawn = getattr(idist, "spawn", None)
    if spawn is not None:

        def ours() -> None:
            spawn(lw.idist_worker, nprocs=world_size)

    else:
        notes["idist"] = "idist.spawn missing: torch.multiprocessing.spawn + idist.initialize"

        def ours() -> None:
            tmp.spawn(lw.idist_by_hand_worker, args=(world_size, h.free_port()), nprocs=world_size, join=True)

    return {"raw": raw, "ignite": ignite, "idist": ours}, notes


def _launch(rounds: int) -> dict[str, Any]:
    impls, notes = _launch_impls(2)
    inner, times = h.interleave(
        impls, rounds=rounds, warmup=1, target_s=0.0, sync=lambda: None, agree=lambda n: n, max_inner=1
    )
    return {"name": "launch 2 ranks + init + barrier + finalize", "inner": inner, "notes": notes,
            "times_s": times, "stats": h.summarise(times, "raw")}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = h.parser(__doc__, target_ms=20.0)
    p.add_argument("--world-sizes", default="2,1", help="comma-separated, e.g. 2,1")
    p.add_argument("--launch-rounds", type=int, default=7, help="0 skips the launch workload")
    p.add_argument("--only", default="", help="only workloads whose name contains this")
    p.add_argument("--timeout", type=float, default=1800.0)
    args = p.parse_args(argv)

    started = time.monotonic()
    payload: dict[str, Any] = {"command": " ".join(["benchmarks/bench_collectives.py", *(argv or sys.argv[1:])]),
                               "environment": h.environment(), "sections": {}}  # fmt: skip
    tables = []
    for ws in (int(x) for x in args.world_sizes.split(",") if x):
        rows = h.run_ranks(
            _rank_main, ws, ws, args.rounds, args.warmup, args.target_ms / 1e3, args.only, timeout=args.timeout
        )[0]
        title = f"{ws} rank{'s' if ws > 1 else ''} (gloo, CPU)"
        payload["sections"][title] = rows
        tables.append(h.table(title, rows, IMPLS, "raw"))
        print(tables[-1], "\n", flush=True)
    if args.launch_rounds > 0 and (not args.only or args.only in "launch"):
        row = _launch(args.launch_rounds)
        payload["sections"]["launch"] = [row]
        tables.append(h.table("launch (2 ranks, spawn start method)", [row], IMPLS, "raw"))
        print(tables[-1], "\n", flush=True)
    payload["wall_s"] = time.monotonic() - started
    path = h.write_json("collectives", payload)
    print(f"rounds={args.rounds} (interleaved, order rotated each round); wall {payload['wall_s']:.0f} s; "
          f"JSON: {path}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
