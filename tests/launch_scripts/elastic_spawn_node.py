"""One node of an elastic ``idist.spawn`` job: ``elastic_spawn_node.py OUT PORT MAX_RESTARTS [STALL_STEP HOLD_BELOW]``.

Runs ``elastic_fns.train`` on 1 gloo rank of 1..2 nodes at 127.0.0.1:PORT (PYTHONPATH must hold
tests/); the node that ends well writes the parameters it got back to OUT/final.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import elastic_fns
import idist


def main() -> None:
    out, port, restarts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    stall, hold = (int(sys.argv[4]), int(sys.argv[5])) if len(sys.argv) > 5 else (-1, 0)
    results = idist.spawn(
        "gloo",
        elastic_fns.train,
        (out,),
        {"stall_step": stall, "hold_below": hold},
        nproc_per_node=1,
        nnodes=(1, 2),
        master_addr="127.0.0.1",
        master_port=port,
        max_restarts=restarts,
    )
    torch.save(results[0], Path(out) / "final.pt")


if __name__ == "__main__":
    main()
