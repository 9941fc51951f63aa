"""Rank 1 aborts (SIGABRT) after its collectives returned; rank 0 sleeps (run by ``idist run``): the
launcher must not say that rank 1 died inside a collective."""

from __future__ import annotations

import os
import time

import torch

import idist

ctx = idist.initialize("gloo", checked=False)
ctx.all_reduce(torch.ones(3))
ctx.barrier()
print(f"rank {ctx.rank}: returned", flush=True)
if ctx.rank == 1:
    os.abort()
time.sleep(600)
