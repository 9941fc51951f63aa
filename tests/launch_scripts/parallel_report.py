"""Run under a launcher (torchrun, mpirun, srun): Parallel initializes in place; print JSON.

Usage: python parallel_report.py [--ask-for-procs N]   (a process count under a launcher must be refused;
the refusal printed, the same process then initializes in place: the refused call left nothing behind)
"""

from __future__ import annotations

import json
import sys

import idist


def body(local_rank: int, tag: str, scale: int = 1) -> dict[str, object]:
    ctx = idist.current()
    return {
        "tag": tag,
        "local_rank_arg": local_rank,
        "type": type(ctx).__name__,
        "launcher": ctx.config.get("launcher"),
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "local_rank": ctx.local_rank,
        "sum": idist.all_reduce((ctx.rank + 1) * scale),
        "gathered": idist.all_gather(ctx.rank),
    }


if __name__ == "__main__":
    if "--ask-for-procs" in sys.argv:
        try:
            idist.Parallel(backend="gloo", nproc_per_node=int(sys.argv[-1]))
        except idist.LaunchConfigError as e:
            print(json.dumps({"refused": str(e)}), flush=True)
    with idist.Parallel() as parallel:
        (out,) = parallel.run(body, "in-place", scale=10)
    out["after_exit"] = type(idist.current()).__name__
    print(json.dumps(out), flush=True)
