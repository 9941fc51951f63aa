"""Run under a launcher: initialize() with no arguments, report what it detected as JSON."""

from __future__ import annotations

import json

import idist

ctx = idist.initialize()
try:
    got = ctx.all_gather(ctx.rank)
    print(
        json.dumps(
            {
                "type": type(ctx).__name__,
                "backend": ctx.backend,
                "rank": ctx.rank,
                "world_size": ctx.world_size,
                "local_rank": ctx.local_rank,
                "nproc_per_node": ctx.nproc_per_node,
                "launcher": ctx.config.get("launcher"),
                "gathered": got,
                "sum": ctx.all_reduce(ctx.rank + 1),
            }
        ),
        flush=True,
    )
finally:
    idist.finalize()
