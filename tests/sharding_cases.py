"""Training runs shared by the FSDP, accumulation and checkpoint tests (imported by the ranks).

The data set has ``N`` samples and the global batch is ``B``: six batches an epoch, six
samples per rank on 2 ranks and four on 3, so every rank's mean loss weighs as much as
another's and N ranks at global batch B must train like one process at batch B.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

import idist
from training_cases import Regression

N, B = 72, 12


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.lin(x))


class Net(nn.Module):
    """Children with parameters (``inp``, ``blocks``, ``out``) and nested ``Block`` modules."""

    def __init__(self, out: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 16)
        self.blocks = nn.Sequential(Block(16), Block(16))
        self.act = nn.Tanh()
        self.out = nn.Linear(16, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(self.act(self.inp(x))))


def make(ctx: idist.DistContext, strategy: str = "ddp", seed: int = 0, **kwargs: Any) -> tuple[nn.Module, Any]:
    """The model from ``seed``'s weights, through auto_model, with Adam through auto_optim."""
    torch.manual_seed(seed)
    model = ctx.auto_model(Net(), strategy=strategy, **kwargs)
    opt = ctx.auto_optim(torch.optim.Adam(model.parameters(), lr=0.01))
    return model, opt


def run_epochs(ctx: idist.DistContext, model: nn.Module, opt: Any, start: int, stop: int, accumulate: int = 1) -> None:
    """Epochs ``start..stop-1``; with ``accumulate=K`` one step per K batches, the first K-1 under no_sync."""
    loader = ctx.auto_dataloader(Regression(N), batch_size=B, shuffle=True)
    loader.set_epoch(start)
    for _ in range(start, stop):
        for i, (x, y, _idx) in enumerate(loader):
            last = (i + 1) % accumulate == 0
            with ctx.no_sync(model, enabled=not last):
                (nn.functional.mse_loss(model(x), y) / accumulate).backward()
            if last:
                opt.step()
                opt.zero_grad()


def full_state(model: nn.Module, opt: Any) -> dict[str, list[float]]:
    """Every parameter and optimizer tensor, whole (every rank calls it under FSDP), as plain floats."""
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    out = {f"model.{k}": v.detach().flatten().tolist() for k, v in msd.items()}
    for fqn, entry in osd["state"].items():
        for k, v in entry.items():
            out[f"optim.{fqn}.{k}"] = torch.as_tensor(v).detach().flatten().tolist()
    return out


def assert_close(a: dict[str, list[float]], b: dict[str, list[float]], atol: float = 1e-5) -> None:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    for k in a:
        torch.testing.assert_close(torch.tensor(a[k]), torch.tensor(b[k]), rtol=0, atol=atol, msg=k)


def local_fraction(model: nn.Module, opt: Any) -> tuple[float, float]:
    """The share of the parameters and of the optimizer's tensors this rank holds."""
    from torch.distributed.tensor import DTensor

    def sizes(ts: list[torch.Tensor]) -> tuple[int, int]:
        local = sum(t.to_local().numel() if isinstance(t, DTensor) else t.numel() for t in ts)
        return local, sum(t.numel() for t in ts)

    params = list(model.parameters())
    states = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    (pl, pt), (sl, st) = sizes(params), sizes(states)
    return pl / pt, sl / st
