"""Unchecked all_reduce of float32 on rank 0 and float64 on rank 1 (run by ``idist run``): gloo
aborts the rank that receives more bytes than its tensor holds (SIGABRT). Two small collectives
come first, so the aborted one is the third on the world group."""

from __future__ import annotations

import torch

import idist

ctx = idist.initialize("gloo", checked=False)
ctx.all_reduce(torch.ones(3))
ctx.barrier()
ctx.all_reduce(torch.ones(4, dtype=torch.float32 if ctx.rank == 0 else torch.float64))
print(f"rank {ctx.rank}: returned", flush=True)
