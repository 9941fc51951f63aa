"""A 2-rank collectives demo: each rank prints what it sent and what it received.

Run: python -m torch.distributed.run --standalone --nproc_per_node 2 examples/collectives_demo.py
"""

from __future__ import annotations

import torch

import idist


def main() -> None:
    with idist.context() as ctx:  # detects torchrun's environment: gloo on CPU
        r = ctx.rank
        t = torch.tensor([float(r + 1)])
        print(f"[rank {r}] all_reduce(tensor {t.tolist()}) -> {ctx.all_reduce(t).tolist()}", flush=True)
        print(f"[rank {r}] all_reduce(0.1 * {r + 1}) -> {ctx.all_reduce(0.1 * (r + 1))!r}", flush=True)
        word = "héllo✓" * (r + 1)
        print(f"[rank {r}] all_gather({word!r}) -> {ctx.all_gather(word)}", flush=True)
        shapes = ctx.all_gather(torch.ones(r + 1, 2))
        print(f"[rank {r}] all_gather(ones({r + 1}, 2)) -> shapes {[tuple(s.shape) for s in shapes]}", flush=True)
        got = ctx.broadcast({"lr": 0.1, "epochs": 3} if r == 0 else None, src=0)
        print(f"[rank {r}] broadcast(config from rank 0) -> {got}", flush=True)


if __name__ == "__main__":
    main()
