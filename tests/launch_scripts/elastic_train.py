"""``elastic_fns.train`` as a script, for ``idist run`` and torchrun: the elastic tests' training run.

``elastic_train.py OUT [--strategy ddp|fsdp|ddp,fsdp] [--crash-step K --crash-rank R [--crash-always]]
[--stall-step K [--stall-below W]] [--hold-below W]``: the options are ``elastic_fns.train``'s (resume
from OUT/ckpt, the injected failure, the stalled ranks, the fresh start that waits for a joining node).
Rank 0 writes the final parameters to OUT/final.pt.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, where elastic_fns lives

import torch

import elastic_fns
import idist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--crash-step", type=int, default=-1)
    p.add_argument("--crash-rank", type=int, default=0)
    p.add_argument("--crash-always", action="store_true")
    p.add_argument("--stall-step", type=int, default=-1)
    p.add_argument("--stall-below", type=int, default=0)
    p.add_argument("--hold-below", type=int, default=0)
    a = p.parse_args()
    ctx = idist.initialize()
    try:
        final = elastic_fns.train(
            ctx.local_rank,
            str(a.out),
            crash_step=a.crash_step,
            crash_rank=a.crash_rank,
            crash_always=a.crash_always,
            stall_step=a.stall_step,
            hold_below=a.hold_below,
            stall_below=a.stall_below,
            strategy=a.strategy,
        )
        if ctx.rank == 0:
            torch.save(final, a.out / "final.pt")
    finally:
        idist.finalize()


if __name__ == "__main__":
    main()
