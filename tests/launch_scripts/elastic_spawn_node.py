"""One node of an elastic ``idist.spawn`` job.

``elastic_spawn_node.py OUT ADDR:PORT NPROC MAX_RESTARTS STALL_STEP HOLD_BELOW [--nnodes N|MIN:MAX]
[--crash-step K --crash-rank R [--crash-always]]`` runs ``elastic_fns.train`` on NPROC gloo ranks,
one node of 1..2 (``--nnodes``) at the rendezvous ADDR:PORT (PYTHONPATH must hold tests/); a node
that ends well writes its local rank 0's parameters to OUT/final-PID.pt.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

import elastic_fns
import idist


def main() -> None:
    p = argparse.ArgumentParser()
    for name in ("out", "endpoint", "nproc", "restarts", "stall", "hold"):
        p.add_argument(name)
    p.add_argument("--nnodes", default="1:2")
    p.add_argument("--crash-step", type=int, default=-1)
    p.add_argument("--crash-rank", type=int, default=0)
    p.add_argument("--crash-always", action="store_true")
    a = p.parse_args()
    addr, _, port = a.endpoint.rpartition(":")
    low, _, high = a.nnodes.partition(":")
    results = idist.spawn(
        "gloo",
        elastic_fns.train,
        (a.out,),
        {
            "stall_step": int(a.stall),
            "hold_below": int(a.hold),
            "crash_step": a.crash_step,
            "crash_rank": a.crash_rank,
            "crash_always": a.crash_always,
        },
        nproc_per_node=int(a.nproc),
        nnodes=(int(low), int(high or low)),
        master_addr=addr,
        master_port=int(port),
        max_restarts=int(a.restarts),
    )
    torch.save(results[0], Path(a.out) / f"final-{os.getpid()}.pt")


if __name__ == "__main__":
    main()
