"""Collective rows every backend's semantics test shares (run on each rank, returns plain values)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import idist


def gather_rows(ctx: idist.DistContext) -> dict[str, Any]:
    """all_gather of tensors of different shapes and of every codec type."""
    rank = ctx.rank
    g = ctx.all_gather(torch.arange(rank + 1, dtype=torch.int64).reshape(1, rank + 1))
    s = "héllo✓\U0001f600" * (1 + rank * 3000) + "\ud800"
    return {
        "gather_shapes": [tuple(x.shape) for x in g],
        "gather_vals": [x.tolist() for x in g],
        "gather_str": ctx.all_gather(s),
        "gather_bytes": ctx.all_gather(bytes(range(256)) * rank),
        "gather_int": ctx.all_gather(2**100 * (rank + 1)),
        "gather_path": ctx.all_gather(Path(f"/tmp/r{rank}")),
        "gather_obj": ctx.all_gather({"rank": rank, "list": [rank] * rank}),
    }


def broadcast_rows(ctx: idist.DistContext) -> dict[str, Any]:
    """broadcast from every src to None receivers, and a big tensor in place."""
    rank, n = ctx.rank, ctx.world_size
    out: dict[str, Any] = {
        f"bcast_py_{src}": ctx.broadcast(1e300 + src if rank == src else None, src) for src in range(n)
    }
    big = torch.arange(100_000, dtype=torch.float32) if rank == n - 1 else torch.zeros(100_000)
    got = ctx.broadcast(big, src=n - 1)
    out["bcast_big"] = (got is big, float(got.double().sum()))
    out["bcast_str"] = ctx.broadcast("ünïcode✓" * 5000 if rank == 0 else None)
    out["bcast_int"] = ctx.broadcast(2**63 - 1 if rank == 0 else None)
    return out


_STORES: dict[int, Any] = {}


def fresh_context(rank: int, world_size: int, case: str, *, checked: bool = False, timeout: float = 30.0) -> Any:
    """A gloo context of its own for ``case`` over the launch's store (``MASTER_PORT``; rank 0
    serves it), so that one launch of real processes serves several cases, also those that
    break their group. Close it when the case is done."""
    import os
    from datetime import timedelta

    from torch.distributed import PrefixStore, TCPStore

    from idist import NativeContext

    port = int(os.environ["MASTER_PORT"])
    store = _STORES.get(port)
    if store is None:
        store = _STORES[port] = TCPStore(
            "127.0.0.1", port, world_size, is_master=rank == 0, timeout=timedelta(seconds=60)
        )
    return NativeContext.in_process(PrefixStore(case, store), rank, world_size, timeout=timeout, checked=checked)
