"""What gloo's primitives cost relative to each other (no idist, no ignite).

    .venv/bin/python benchmarks/probe_gloo_primitives.py [--rounds 25] [--world-size 2]

The floors under idist's choices: how many elements a Python-number all_reduce can carry
for the price of one, what a gather costs next to a reduce, and what a header costs a
large tensor broadcast (sent before the data, or started together with it). Interleaved
like the other benchmarks; ratios are to ``allreduce int64[1]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness as h


def _rank_main(rank: int, ws: int, rounds: int, target_s: float) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import AllreduceOptions, BroadcastOptions

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank, world_size=ws
    )
    try:
        pg = dist.group.WORLD
        assert pg is not None
        ar = AllreduceOptions()
        bo = BroadcastOptions()
        bo.rootRank = 0
        impls: dict[str, Callable[[], object]] = {}
        for n in (1, 2, 8, 16):
            t = torch.zeros(n, dtype=torch.int64)
            impls[f"allreduce int64[{n}]"] = lambda t=t: pg.allreduce([t], ar).wait()
        for nb in (8, 64, 4096):
            b = torch.zeros(nb, dtype=torch.uint8)
            o = torch.empty(nb * ws, dtype=torch.uint8)
            impls[f"_allgather_base {nb} B"] = lambda o=o, b=b: pg._allgather_base(o, b).wait()
            impls[f"allgather (list) {nb} B"] = lambda o=o, b=b: pg.allgather([list(o.chunk(ws))], [b]).wait()
        small = torch.zeros(64, dtype=torch.uint8)
        impls["broadcast 64 B"] = lambda: pg.broadcast([small], bo).wait()
        for nb in (1 << 18, 1 << 22):  # a header before the data: after it, or started together
            d = torch.zeros(nb, dtype=torch.uint8)
            impls[f"broadcast {nb >> 10} KiB"] = lambda d=d: pg.broadcast([d], bo).wait()
            impls[f"broadcast 64 B, then {nb >> 10} KiB"] = lambda d=d: (
                pg.broadcast([small], bo).wait(),
                pg.broadcast([d], bo).wait(),
            )
            impls[f"broadcast 64 B and {nb >> 10} KiB together"] = lambda d=d: [
                w.wait() for w in (pg.broadcast([small], bo), pg.broadcast([d], bo))
            ]

        def agree(n: int) -> int:
            t = torch.tensor([n])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return int(t.item())

        _, times = h.interleave(impls, rounds=rounds, warmup=3, target_s=target_s, sync=dist.barrier, agree=agree)
        return {"name": f"gloo primitives, {ws} ranks", "notes": {}, "times_s": times,
                "stats": h.summarise(times, "allreduce int64[1]")}  # fmt: skip
    finally:
        dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=25)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--target-ms", type=float, default=20.0)
    args = p.parse_args()
    row = h.run_ranks(_rank_main, args.world_size, args.world_size, args.rounds, args.target_ms / 1e3, timeout=900)[0]
    print(f"| primitive ({args.world_size} ranks) | median | ratio to allreduce int64[1] (IQR) |")
    print("|---|---|---|")
    for name, s in row["stats"].items():
        print(f"| {name} | {h.fmt_time(s['median_us'])} | {s['ratio_median']:.2f}x "
              f"({s['ratio_q1']:.2f}-{s['ratio_q3']:.2f}) |")  # fmt: skip
    h.write_json("gloo_primitives", {"command": " ".join(sys.argv), "environment": h.environment(), "rows": [row]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
