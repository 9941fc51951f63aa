"""One node of an elastic ``idist.spawn`` job.

``elastic_spawn_node.py OUT ADDR:PORT NPROC MAX_RESTARTS STALL_STEP HOLD_BELOW`` runs
``elastic_fns.train`` on NPROC gloo ranks, one node of 1..2 at the rendezvous ADDR:PORT
(PYTHONPATH must hold tests/); a node that ends well writes its local rank 0's parameters to
OUT/final-PID.pt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

import elastic_fns
import idist


def main() -> None:
    out, endpoint, nproc, restarts, stall, hold = sys.argv[1:7]
    addr, _, port = endpoint.rpartition(":")
    results = idist.spawn(
        "gloo",
        elastic_fns.train,
        (out,),
        {"stall_step": int(stall), "hold_below": int(hold)},
        nproc_per_node=int(nproc),
        nnodes=(1, 2),
        master_addr=addr,
        master_port=int(port),
        max_restarts=int(restarts),
    )
    torch.save(results[0], Path(out) / f"final-{os.getpid()}.pt")


if __name__ == "__main__":
    main()
