"""Run under a launcher: initialize(), print one JSON line per rank, optionally fail.

Usage: python report.py [args...] [--fail-rank R --how exit7|sigkill|raise]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import idist

p = argparse.ArgumentParser()
p.add_argument("--fail-rank", type=int, default=-1)
p.add_argument("--how", default="exit7")
p.add_argument("rest", nargs="*")
a = p.parse_args()

ctx = idist.initialize()
print(
    json.dumps({
        "rank": ctx.rank, "world_size": ctx.world_size, "local_rank": ctx.local_rank,
        "node_rank": ctx.node_rank, "nnodes": ctx.nnodes, "nproc_per_node": ctx.nproc_per_node,
        "launcher": ctx.config.get("launcher"), "backend": ctx.backend, "args": a.rest,
        "gathered": ctx.all_gather(ctx.rank), "sum": ctx.all_reduce(ctx.rank + 1),
    }),
    flush=True,
)  # fmt: skip
if ctx.rank == a.fail_rank:
    time.sleep(0.5)
    if a.how == "exit7":
        sys.exit(7)
    if a.how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError("report.py was asked to fail")
if a.fail_rank >= 0:
    ctx.barrier()  # wait for the failing rank: only the launcher's fail-fast ends this
    time.sleep(600)
idist.finalize()
