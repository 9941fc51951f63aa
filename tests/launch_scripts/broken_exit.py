"""Rank 1 passes one bad input (unchecked, so the group breaks), then the script ends: with the
error uncaught (exit status 1 and a traceback), or caught and a normal exit (status 0).

    python broken_exit.py CASE MODE              ranks from the launcher's variables
    python broken_exit.py all caught             every case in turn, each on its own context
    python broken_exit.py CASE MODE spawn        idist.spawn of 2 ranks (prints their exit codes)
    python broken_exit.py CASE MODE parallel     idist.Parallel of 2 ranks

Every rank prints ``RANK r: <error class>`` once its collective failed. Run by tests/test_exit_broken.py.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import timedelta

import torch
from torch.distributed import PrefixStore, TCPStore

import idist

Call = Callable[[idist.DistContext], object]
#: (what every other rank calls, what rank 1 calls)
CASES: dict[str, tuple[Call, Call]] = {
    "bad-src": (lambda c: c.broadcast(1.0, src=0), lambda c: c.broadcast(1.0, src=5)),
    "bad-group": (lambda c: c.all_reduce(1, group=[0, 1]), lambda c: c.all_reduce(1, group=[0, 5])),
    "unknown-op": (lambda c: c.all_reduce(torch.ones(2)), lambda c: c.all_reduce(torch.ones(2), "FOO")),  # type: ignore[call-overload]
    "average-ints": (
        lambda c: c.all_reduce(torch.ones(2, dtype=torch.int64), "SUM"),
        lambda c: c.all_reduce(torch.ones(2, dtype=torch.int64), "AVERAGE"),
    ),
    "meta": (lambda c: c.all_reduce(torch.ones(2)), lambda c: c.all_reduce(torch.ones(2, device="meta"))),
}


def body(ctx: idist.DistContext, case: str, mode: str) -> None:
    good, bad = CASES[case]
    ctx.all_reduce(torch.ones(1000))  # a collective that worked, as in any real script
    try:
        (bad if ctx.rank == 1 else good)(ctx)
    except idist.IdistError as exc:
        print(f"RANK {ctx.rank}: {type(exc).__name__}", flush=True)
        if mode == "uncaught":
            raise
        return
    print(f"RANK {ctx.rank}: no error", flush=True)


def rank_main(local_rank: int, case: str, mode: str) -> None:
    ctx = idist.initialize("gloo", checked=False, timeout=60)
    body(ctx, case, mode)


def every_case(mode: str) -> None:
    """Each case on a context of its own over one store (a prefix each): all but the last closed
    with their group broken, the last left open for the interpreter's exit, like ``rank_main``'s."""
    rank = int(os.environ["RANK"])
    server = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 2, rank == 0,
                      timeout=timedelta(seconds=60), wait_for_workers=False)  # fmt: skip
    for i, case in enumerate(CASES):
        ctx = idist.initialize("gloo", rank=rank, world_size=2, store=PrefixStore(case, server), checked=False,
                               timeout=60)  # fmt: skip
        body(ctx, case, mode)
        if i < len(CASES) - 1:
            idist.finalize()


def parallel_main(local_rank: int, case: str, mode: str) -> None:
    body(idist.current(), case, mode)


def main() -> None:
    case, mode, launcher = [*sys.argv[1:], "env"][:3]
    if case == "all":
        every_case(mode)
    elif launcher == "env":
        rank_main(0, case, mode)
    elif launcher == "spawn":
        handle = idist.spawn(rank_main, args=(case, mode), nprocs=2, join=False)
        try:
            handle.join()
        finally:
            print("EXITCODES", [p.exitcode for p in handle.processes], flush=True)
    else:
        with idist.Parallel(backend="gloo", nproc_per_node=2) as parallel:
            parallel.run(parallel_main, case, mode)


if __name__ == "__main__":
    main()
