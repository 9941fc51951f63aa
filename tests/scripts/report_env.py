"""Run under a launcher: initialize() with no arguments; write what it detected to DIR/rankN.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import idist

ctx = idist.initialize()
try:
    got = ctx.all_gather(ctx.rank)
    Path(sys.argv[1], f"rank{ctx.rank}.json").write_text(
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
        )
    )
finally:
    idist.finalize()
