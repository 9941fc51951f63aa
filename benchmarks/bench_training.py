"""Training helpers vs the same thing written by hand, interleaved on 2 gloo ranks.

    .venv/bin/python benchmarks/bench_training.py [--rounds 15] [--world-size 2]

- ``loader``: one epoch over ``auto_dataloader(ds, batch_size=64, shuffle=True)`` vs a
  hand-built ``DataLoader(ds, batch_size=32, sampler=DistributedSampler(ds))`` with
  ``set_epoch`` called by hand; reported per epoch and per iteration (target: ≤ 2 %).
- ``loader of ints``: one pass of 4096 batches of 1 int per rank, no collation: the
  ``AutoDataLoader``'s own per-batch cost (its iterator, the batch weight it writes) vs a
  ``DataLoader`` over the same sampler; reported per batch.
- ``ddp step``: zero_grad + forward + backward + optimizer step through
  ``auto_model``/``auto_optim`` vs ``DistributedDataParallel(model, process_group=WORLD)``
  written by hand (target ratio ≤ 1.02).

Both implementations of a workload share the process group and run in the same process
launch, alternating each round (see ``_harness``). Prints Markdown tables; writes
``benchmarks/out/training.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness as h

IMPLS = ("hand", "idist")


def _workloads(rank: int, ws: int) -> list[h.Workload]:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    import idist

    ctx = idist.current()  # adopts the group this worker initialized
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(8192, 32, generator=g), torch.randint(0, 10, (8192,), generator=g))
    per_rank = 32

    hand_sampler = DistributedSampler(ds, num_replicas=ws, rank=rank, shuffle=True)
    hand_loader = DataLoader(ds, batch_size=per_rank, sampler=hand_sampler)
    auto_loader = ctx.auto_dataloader(ds, batch_size=per_rank * ws, shuffle=True)
    assert len(hand_loader) == len(auto_loader)
    epoch = {"hand": 0}

    def hand_epoch() -> int:
        hand_sampler.set_epoch(epoch["hand"])
        epoch["hand"] += 1
        n = 0
        for _x, _y in hand_loader:
            n += 1
        return n

    def auto_epoch() -> int:
        n = 0
        for _x, _y in auto_loader:
            n += 1
        return n

    ints = list(range(4096 * ws))
    auto_ints = ctx.auto_dataloader(ints, batch_size=ws, collate_fn=_as_is)
    hand_ints = DataLoader(ints, batch_size=1, sampler=auto_ints.sampler, collate_fn=_as_is)

    def count(loader: DataLoader[Any]) -> int:
        n = 0
        for _b in loader:
            n += 1
        return n

    def make() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))

    hand_model = DistributedDataParallel(make(), process_group=dist.group.WORLD)
    hand_opt = torch.optim.SGD(hand_model.parameters(), lr=0.01)
    auto_model = ctx.auto_model(make())
    auto_opt = ctx.auto_optim(torch.optim.SGD(auto_model.parameters(), lr=0.01))
    x = torch.randn(64, 256, generator=g)
    y = torch.randint(0, 10, (64,), generator=g)

    def step(model: nn.Module, opt: torch.optim.Optimizer) -> float:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return float(loss.detach())

    batches = len(hand_loader)
    return [
        h.Workload(
            f"loader epoch ({batches} iterations of {per_rank}/rank)", {"hand": hand_epoch, "idist": auto_epoch}
        ),
        h.Workload(
            "loader of ints (4096 iterations of 1/rank)",
            {"hand": lambda: count(hand_ints), "idist": lambda: count(auto_ints)},
        ),
        h.Workload(
            "ddp step (MLP 256-512-512-10, batch 64/rank)",
            {"hand": lambda: step(hand_model, hand_opt), "idist": lambda: step(auto_model, auto_opt)},
        ),
    ]


def _as_is(batch: list[int]) -> list[int]:
    return batch


def _rank(rank: int, ws: int, rounds: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # 2 ranks on a shared machine: no intra-op thread oversubscription
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    try:
        rows = []
        for w in _workloads(rank, ws):
            inner, times = h.interleave(
                w.impls, rounds=rounds, warmup=2, target_s=0.3, sync=h.dist_sync, agree=h.dist_agree
            )
            rows.append({"name": w.name, "inner": inner, "times": times})
        return {"rows": rows}
    finally:
        dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--world-size", type=int, default=2)
    args = p.parse_args()
    results = h.run_ranks(_rank, args.world_size, args.world_size, args.rounds, timeout=1800)
    rows = []
    for row in results[0]["rows"]:  # rank 0's clock; every rank ran the same calls
        stats = h.summarise(row["times"], "hand")
        rows.append({"name": row["name"], "stats": stats, "notes": {}})
        if row["name"].startswith("loader"):
            n = int(row["name"].split("(")[1].split()[0])
            per_it = {k: {**v, "median_us": v["median_us"] / n, "diff_us_median": v["diff_us_median"] / n}
                      for k, v in stats.items()}  # fmt: skip
            label = "loader of ints, per batch" if row["name"].startswith("loader of ints") else "loader, per iteration"
            rows.append({"name": label, "stats": per_it, "notes": {}})
    print(h.table(f"training helpers, {args.world_size} gloo ranks", rows, IMPLS, "hand"))
    path = h.write_json("training", {"env": h.environment(), "args": vars(args), "rows": rows})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
