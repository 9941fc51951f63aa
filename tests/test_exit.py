"""Finishing cleanly: gloo's worker threads let go of every tensor before the process ends.

A gloo work object holds its tensors until a worker thread destroys it, a moment after
``wait()`` returned; a worker that does so during interpreter finalization aborts the
process ("terminate called without an active exception"). idist holds those tensors and
waits for the workers when a context closes and at exit (``_backends/_inflight.py``).
"""

from __future__ import annotations

import sys

import pytest
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


# The worker that ran a collective destroys its work a moment after wait() returned, and with
# it a copy of the caller's thread-local state: Python objects (here the saved-tensor hooks;
# in every backward, the context torch keeps for it) whose release needs the GIL, which a
# worker cannot have once the interpreter finalizes. DDP and FSDP run their collectives
# themselves, so no tensor of theirs is held by idist. The workers are starved as on a
# loaded machine: they share the main thread's CPU with the lowest priority, so they run
# only while it sleeps.
_STARVED_WORKERS = """
import atexit, sys
def pack(t): return t
def unpack(t): return t
# Registered before idist is imported, so it runs after idist's own exit hooks: references
# still held here are dropped by gloo's workers while the interpreter finalizes.
atexit.register(lambda: print("held", sys.getrefcount(pack) - base, flush=True))
import os, torch
from torch import nn
import idist
rank, port, strategy = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.sched_setaffinity(0, {rank % os.cpu_count()})
ctx = idist.initialize("gloo", rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port, liveness=0)
model = ctx.auto_model(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)), strategy=strategy)
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/comm") as f:
        if f.read().strip() == "pt_gloo_runloop":
            os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
base = sys.getrefcount(pack)
with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
    model(torch.randn(4, 8)).sum().backward()
"""


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_gloo_workers_let_go_of_python_objects_before_the_interpreter_finalizes(strategy: str) -> None:
    with reserve_port() as reservation:
        port = str(reservation.port)
        reservation.close()
        cmds = [[sys.executable, "-c", _STARVED_WORKERS, str(r), port, strategy] for r in (0, 1)]
        done = run_together(cmds, [clean_env()] * 2, timeout=120)
    assert [p.returncode for p in done] == [0, 0], [p.stderr[-2000:] for p in done]
    assert [p.stdout.split() for p in done] == [["held", "0"]] * 2
