"""Rank 1 stops answering (SIGSTOP) while rank 0 waits inside torch's own collectives, which
idist cannot interrupt: DDP's gradient all_reduce in backward, or FSDP's all-gather in forward.

    idist run -n 2 stuck_in_torch.py ddp|fsdp LIMIT

Rank 0's liveness watcher must end its process with status 1 and say why. Run by
tests/test_liveness.py.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
from torch import nn

import idist

strategy, limit = sys.argv[1], float(sys.argv[2])
ctx = idist.initialize("gloo", timeout=600, liveness=limit)
torch.manual_seed(0)
model = ctx.auto_model(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1)), strategy=strategy)
model(torch.ones(2, 8)).sum().backward()  # one step that works
ctx.barrier()
if ctx.rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)  # alive, connections open, answering nothing
print(f"RANK 0 waits in {strategy} at {time.monotonic():.3f}", flush=True)
model(torch.ones(2, 8)).sum().backward()
print("RANK 0 returned", flush=True)
