"""Custom Communication: all_reduce, all_gather and broadcast of tensors and Python values
between 2 gloo ranks started with idist.spawn, including a subgroup.

Run: python examples/custom_communication.py
"""

from __future__ import annotations

import torch

import idist


def communicate(local_rank: int) -> None:
    with idist.context("gloo") as ctx:
        r, n = ctx.rank, ctx.world_size

        # all_reduce: tensors in place, Python numbers exactly (no float32 round trip)
        grads = torch.full((3,), float(r + 1))
        idist.all_reduce(grads)
        mean_loss = idist.all_reduce(0.1 * (r + 1), op="AVERAGE")
        largest = idist.all_reduce(2**60 + r, op="MAX")
        print(f"[rank {r}] all_reduce: grads={grads.tolist()} mean_loss={mean_loss!r} max={largest}", flush=True)

        # all_gather: one entry per rank, shapes may differ, any string round-trips
        rows = idist.all_gather(torch.arange(r + 1))
        names = idist.all_gather(f"wörker-{r}✓")
        print(f"[rank {r}] all_gather: rows={[t.tolist() for t in rows]} names={names}", flush=True)

        # broadcast: receivers may pass None (the result may then be None: src could have passed it),
        # or a placeholder of src's type (a tensor of the same shape and dtype is filled in place)
        config = idist.broadcast({"lr": 3e-4, "epochs": 2} if r == 0 else None, src=0)
        weights = idist.broadcast(torch.arange(4.0) if r == n - 1 else torch.empty(4), src=n - 1)
        print(f"[rank {r}] broadcast: config={config} weights={weights.tolist()}", flush=True)

        # a subgroup: ranks outside it get their input back unchanged
        group = idist.new_group([0])
        print(f"[rank {r}] group sum over [0]: {idist.all_reduce(r + 100, group=group)}", flush=True)
        idist.barrier()


if __name__ == "__main__":
    idist.spawn(communicate, nprocs=2)
