"""The training run of every elastic test (importable by name in the ranks; ``launch_scripts/elastic_train.py``
runs it under ``idist run``): DDP (or FSDP, or both side by side), global batches of 12, a checkpoint every
2 steps in OUT/ckpt, resumed when present; on the first attempt rank ``crash_rank`` raises at ``crash_step``
(at every attempt with ``crash_always``). Every rank returns the final parameters.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import idist

N, GLOBAL_BATCH, EPOCHS, SAVE_EVERY = 48, 12, 3, 2


def train(
    local_rank: int,
    out: str,
    crash_step: int = -1,
    crash_rank: int = 0,
    crash_always: bool = False,
    stall_step: int = -1,
    hold_below: int = 0,
    stall_below: int = 0,
    strategy: str = "ddp",
) -> dict[str, torch.Tensor]:
    """ignite's form (``Parallel``, ``spawn(backend, ...)``): the context is current around the call.

    Ranks started with IDIST_TEST_VICTIM=1 (on the first attempt), and every rank while the world is
    smaller than ``stall_below``, stall at ``stall_step`` before its checkpoint (writing their pid to
    OUT/stalled-rankN) until the test kills them or the agent restarts them for a joining node; a run
    that starts at step 0 on fewer than ``hold_below`` ranks waits at step 1 for a joining node. Under
    FSDP (``strategy``) only rank 0 gets the full parameters back; the others get an empty dict.

    ``strategy="ddp,fsdp"`` trains both models, the same batches to each, in one checkpoint (one job
    checks both instead of one job each); each returned key is then prefixed ``<strategy>/``."""
    ctx = idist.current()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, 5, generator=g)
    data = TensorDataset(x, x @ torch.randn(5, 1, generator=g))
    loader = ctx.auto_dataloader(data, batch_size=GLOBAL_BATCH, shuffle=True)
    state: dict[str, object] = {"loader": loader, "step": 0}
    trained = []
    for k, kind in enumerate(strategy.split(",")):
        torch.manual_seed(0)
        model = ctx.auto_model(nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1)), strategy=kind)
        opt = ctx.auto_optim(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
        state |= {f"model{k or ''}": model, f"optim{k or ''}": opt}  # the first: "model", as a single run's
        trained.append((kind, model, opt))
    ckpt = Path(out) / "ckpt"
    try:
        ctx.load_checkpoint(ckpt, state)
    except idist.CheckpointNotFoundError:
        pass
    step = state["step"]
    assert isinstance(step, int)
    if ctx.rank == 0:
        (Path(out) / f"attempt{attempt}-world{ctx.world_size}-from{step}").touch()
    while loader.state_dict()["epoch"] < EPOCHS:
        for xb, yb in loader:
            for _, model, opt in trained:
                opt.zero_grad()
                nn.functional.mse_loss(model(xb), yb).backward()
                opt.step()
            step += 1
            victim = attempt == 0 and os.environ.get("IDIST_TEST_VICTIM") == "1"
            if step == stall_step and (victim or ctx.world_size < stall_below):
                (Path(out) / f"stalled-rank{ctx.rank}").write_text(str(os.getpid()))
                time.sleep(600)  # until the test kills this node, or the agent restarts for a joining one
            if step == 1 and ctx.world_size < hold_below:
                time.sleep(600)  # until the agent restarts this attempt for a joining node
            if step % SAVE_EVERY == 0:
                state["step"] = step
                ctx.save_checkpoint(ckpt, state)
            if (attempt == 0 or crash_always) and step == crash_step and ctx.rank == crash_rank:
                raise RuntimeError(f"injected failure at step {step}")
    finals: dict[str, torch.Tensor] = {}
    for kind, model, _ in trained:
        full = model.state_dict()
        if kind != "ddp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        prefix = f"{kind}/" if len(trained) > 1 else ""
        finals |= {prefix + k.removeprefix("module."): v.detach().clone() for k, v in full.items()}
    return finals


def train_initializing(local_rank: int, out: str, crash_step: int = -1, crash_rank: int = 0) -> dict[str, torch.Tensor]:
    """torch.multiprocessing's form (``spawn(fn, ...)``): the function initializes and finalizes."""
    idist.initialize()
    try:
        return train(local_rank, out, crash_step, crash_rank)
    finally:
        idist.finalize()
