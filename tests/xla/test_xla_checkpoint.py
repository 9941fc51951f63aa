"""XLA: a replicated model is saved once and loads on any world size; no_sync changes nothing
(each optimizer step averages the accumulated gradients); strategy="fsdp" says what to use.

Runs in the XLA lane (XLA CPU device threads, ``XlaWorld``); skipped without torch_xla.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

if importlib.util.find_spec("torch_xla") is None:
    pytest.skip("torch_xla is not installed (the XLA lane runs these)", allow_module_level=True)

import idist
from idist.testing._xla_world import XlaWorld

pytestmark = pytest.mark.timeout(900)

XS, YS = torch.arange(48.0).reshape(12, 4) / 48, torch.arange(12.0).reshape(12, 1)


def _model(seed: int) -> torch.nn.Module:
    # from a generator of this thread's own: the replicas are threads, torch.manual_seed would be shared
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=g) - 0.5)
    return model


def _snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, list[float]]:
    out = {f"model.{k}": v.detach().cpu().flatten().tolist() for k, v in model.state_dict().items()}
    for i, entry in opt.state_dict()["state"].items():
        out.update({f"optim.{i}.{k}": torch.as_tensor(v).cpu().flatten().tolist() for k, v in entry.items()})
    return out


def _train(ctx: idist.DistContext, model: torch.nn.Module, opt: Any, accumulate: int = 1) -> None:
    loader = ctx.auto_dataloader(torch.utils.data.TensorDataset(XS, YS), batch_size=2 * ctx.world_size)
    for i, (x, y) in enumerate(loader):
        last = (i + 1) % accumulate == 0
        with ctx.no_sync(model, enabled=not last):
            (torch.nn.functional.mse_loss(model(x), y) / accumulate).backward()
        if last:
            opt.step()
            opt.zero_grad()
    ctx.sync()


def save_on_xla(ctx: idist.DistContext, folder: str) -> dict[str, Any]:
    model = ctx.auto_model(_model(1234 + ctx.rank))  # rank 0's weights everywhere
    opt = ctx.auto_optim(torch.optim.Adam(model.parameters(), lr=0.01))
    _train(ctx, model, opt)
    ctx.save_checkpoint(Path(folder) / "ck", {"model": model, "optim": opt, "epoch": 1})
    try:
        idist.auto_model(_model(0), strategy="fsdp")
        fsdp = "no error"
    except idist.TrainingSetupError as exc:
        fsdp = str(exc)
    return {
        "state": _snapshot(model, opt),
        "files": sorted(p.name for p in (Path(folder) / "ck").iterdir()),
        "fsdp": fsdp,
    }


def load_on_xla(ctx: idist.DistContext, folder: str) -> dict[str, Any]:
    model = ctx.auto_model(_model(99))
    opt = ctx.auto_optim(torch.optim.Adam(model.parameters(), lr=0.5))
    values = ctx.load_checkpoint(Path(folder) / "ck", {"model": model, "optim": opt})
    loaded = _snapshot(model, opt)
    _train(ctx, model, opt)  # the loaded state trains on the XLA device
    return {"state": loaded, "epoch": values["epoch"], "device": str(next(model.parameters()).device)}


def accumulate_on_xla(ctx: idist.DistContext) -> list[float]:
    model = ctx.auto_model(_model(7))
    opt = ctx.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1))
    _train(ctx, model, opt, accumulate=3)
    return [float(v) for v in torch.cat([p.detach().cpu().flatten() for p in model.parameters()])]


def test_a_replicated_model_is_saved_once_and_loads_on_any_world_size(tmp_path: Path) -> None:
    with XlaWorld(2, timeout=300) as two:
        saved = two.run(save_on_xla, str(tmp_path))
    assert saved[0]["state"] == saved[1]["state"]
    assert saved[0]["files"] == [".metadata", "__0_0.distcp", "idist-values.pt", "idist.json"]
    for r in saved:
        assert "XlaContext (xla-tpu)" in r["fsdp"] and "strategy='ddp'" in r["fsdp"]
    for n in (1, 3):
        with XlaWorld(n, timeout=300) as world:
            for r in world.run(load_on_xla, str(tmp_path)):
                assert r["state"] == saved[0]["state"] and r["epoch"] == 1  # copies: bit for bit
                assert r["device"].startswith("xla")
    model = _model(5)
    opt = torch.optim.Adam(model.parameters())
    with idist.context("serial") as ctx:
        assert ctx.load_checkpoint(tmp_path / "ck", {"model": model, "optim": opt})["epoch"] == 1
    assert _snapshot(model, opt) == saved[0]["state"]


def test_no_sync_accumulates_like_one_process_stepping_every_k_batches() -> None:
    with XlaWorld(2, timeout=300) as two:
        got = two.run(accumulate_on_xla)
    model = _model(7)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(0, 12, 4):
        (torch.nn.functional.mse_loss(model(XS[i : i + 4]), YS[i : i + 4]) / 3).backward()
        if (i // 4 + 1) % 3 == 0:
            opt.step()
            opt.zero_grad()
    expected = [float(v) for v in torch.cat([p.detach().flatten() for p in model.parameters()])]
    for r in got:
        assert r == pytest.approx(expected, rel=1e-5, abs=1e-6)
