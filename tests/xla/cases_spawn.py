"""Replica functions for ``spawn``/``Parallel`` with backend="xla-tpu" (imported by name).

Run as a script (with ``tests`` on PYTHONPATH) it is a whole program, for the tests that
need a fresh process: ``sleep MARKER N`` spawns N replicas that write their pid and sleep
(to be interrupted); ``launch N`` runs ``torch_xla.launch`` itself on N XLA CPU devices
and prints, per replica, what ``idist`` detects there; ``plain`` loads torch_xla without
any launcher and prints what ``idist.initialize()`` picks.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import idist
from driven_cases import fail_on, report, sleeper
from idist import _detect

__all__ = ["fail_on", "loader_passes", "report", "sleeper"]
from idist.launch import launched_by


def loader_passes(local_rank: int, n: int) -> list[list[list[list[int]]]]:
    """Per setting (no workers, 1 worker, 1 persistent worker): a look at one batch on rank 0, then
    2 whole passes, as this replica's batches of ``range(n)`` (global batch 2 x world size)."""
    import torch
    from torch.utils.data import TensorDataset

    ctx = idist.current()
    out = []
    for workers, persistent in [(0, False), (1, False), (1, True)]:
        loader = ctx.auto_dataloader(
            TensorDataset(torch.arange(n)), batch_size=2 * ctx.world_size, shuffle=True,
            num_workers=workers, persistent_workers=persistent,
        )  # fmt: skip
        if ctx.rank == 0:
            next(iter(loader))
        out.append([[b[0].cpu().tolist() for b in loader] for _ in range(2)])
    return out


def _what_replica_sees(index: int) -> None:
    """Under torch_xla.launch: what a plain idist sees in this replica (one JSON line)."""
    out: dict[str, Any] = {"index": index, "detected": _detect.detect_backend(), "launched_by": launched_by()}
    with idist.context() as ctx:  # no backend named: detected
        out["context"] = [type(ctx).__name__, ctx.backend, ctx.rank, ctx.world_size, ctx.all_reduce(ctx.rank + 1)]
    with idist.Parallel() as parallel:  # in place: this thread's own context
        out["parallel"] = parallel.run(lambda lr: [type(idist.current()).__name__, idist.get_rank(), lr])
    if ctx.world_size == 1:
        ctx1 = idist.initialize()  # one replica: the process default works too
        out["initialize"] = [type(ctx1).__name__, ctx1.backend]
        idist.finalize()
    print("IDIST " + json.dumps(out), flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "sleep":
        idist.spawn("xla-tpu", sleeper, (sys.argv[2],), nproc_per_node=int(sys.argv[3]))
    elif mode == "launch":
        os.environ["CPU_NUM_DEVICES"] = sys.argv[2]
        import torch_xla

        torch_xla.launch(_what_replica_sees)
    elif mode == "plain":
        import torch_xla  # loaded, but no launcher started this process

        ctx = idist.initialize()
        print("IDIST " + json.dumps([type(ctx).__name__, ctx.backend, launched_by()]), flush=True)
        idist.finalize()
