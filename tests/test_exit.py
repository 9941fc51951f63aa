"""Finishing cleanly: gloo's worker threads let go of every tensor before the process ends.

A gloo work object holds its tensors until a worker thread destroys it, a moment after
``wait()`` returned; a worker that does so during interpreter finalization aborts the
process ("terminate called without an active exception"). idist holds those tensors and
waits for the workers when a context closes and at exit (``_backends/_inflight.py``).
"""

from __future__ import annotations

import sys

import torch

import idist
from idist.launch import reserve_port
from idist.testing import simulate
from launch_util import clean_env, run_together


def _collectives_then_close(ctx: idist.NativeContext) -> tuple[int, int]:
    t = torch.ones(1000)
    ctx.all_reduce(t)
    ctx.all_gather({"rank": ctx.rank})
    ctx.broadcast(t, src=0)
    ctx.close()
    return t._use_count(), len(ctx._state.world.inflight.held)


def test_close_returns_after_the_workers_dropped_every_tensor() -> None:
    for _ in range(5):
        assert simulate(2, _collectives_then_close) == [(1, 0), (1, 0)]


# Registered before idist is imported, so it runs after idist's own exit hook.
_NEVER_FINALIZED = """
import atexit, sys, torch
t = torch.ones(1000)
atexit.register(lambda: print("use_count", t._use_count(), flush=True))
import idist
from idist.testing import simulate
rank, port = int(sys.argv[1]), int(sys.argv[2])
ctx = idist.initialize("gloo", rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port)
ctx.all_reduce(t)
ctx.all_gather({"rank": rank})
"""


def test_a_script_that_never_finalizes_exits_cleanly() -> None:
    with reserve_port() as reservation:
        port = str(reservation.port)
        reservation.close()
        cmds = [[sys.executable, "-c", _NEVER_FINALIZED, str(r), port] for r in (0, 1)]
        done = run_together(cmds, [clean_env()] * 2, timeout=120)
    assert [p.returncode for p in done] == [0, 0], [p.stderr for p in done]
    assert [p.stdout.split() for p in done] == [["use_count", "1"]] * 2
