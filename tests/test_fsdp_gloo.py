"""FSDP and gradient accumulation on real gloo processes.

Two ranks at global batch B with ``auto_model(strategy="fsdp")`` train like one process at
batch B (weights and Adam state within 1e-5 after three epochs), with the default policy and
with ``shard_modules``; each rank holds about half of the parameters and of the optimizer
state. K micro-batches, the first K-1 under ``no_sync``, end like one process stepping once
per K global batches, for DDP and for FSDP; inside nested ``no_sync`` blocks no gradient is
exchanged (ranks fed different data keep different gradients).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import idist
from idist import TrainingSetupError
from idist.testing import simulate
from multiproc import run_ranks
from sharding_cases import Block, Net, assert_close, full_state, local_fraction, make, run_epochs

EPOCHS, K = 3, 3


def _error(fn: Any) -> str:
    try:
        fn()
    except TrainingSetupError as exc:
        return str(exc)
    return "no error"


def _rank(rank: int) -> dict[str, Any]:
    ctx = idist.initialize("gloo", timeout=60)
    try:
        out: dict[str, Any] = {}
        model, opt = make(ctx, "fsdp")
        run_epochs(ctx, model, opt, 0, EPOCHS)
        out["fsdp"] = full_state(model, opt)
        out["fraction"] = local_fraction(model, opt)
        out["rewrap"] = ctx.auto_model(model, strategy="fsdp") is model
        model, opt = make(ctx, "fsdp", shard_modules=(Block,))
        run_epochs(ctx, model, opt, 0, EPOCHS)
        out["blocks"] = full_state(model, opt)
        for strategy in ("ddp", "fsdp"):
            model, opt = make(ctx, strategy)
            run_epochs(ctx, model, opt, 0, 2, accumulate=K)
            out[f"accumulate_{strategy}"] = full_state(model, opt)
        for strategy in ("ddp", "fsdp"):
            out[f"no_sync_{strategy}"] = _no_sync_probe(ctx, strategy)
        out["no_match"] = _error(lambda: ctx.auto_model(Net(), strategy="fsdp", shard_modules=(nn.Conv2d,)))
        out["mesh"] = _error(lambda: ctx.auto_model(Net(), strategy="fsdp", mesh=None))
        out["strategy"] = _error(lambda: idist.auto_model(Net(), strategy="zero3"))
        return out
    finally:
        idist.finalize()


def _grads(ctx: idist.DistContext, model: nn.Module) -> tuple[bool, bool]:
    """Whether every rank holds gradients, and then whether they are the same on every rank."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in model.parameters()]
    if not all(ctx.all_gather(all(g is not None for g in grads))):
        return False, False
    flat = torch.cat([(g.full_tensor() if isinstance(g, DTensor) else g).flatten() for g in grads if g is not None])
    seen = ctx.all_gather(flat)
    return True, all(torch.allclose(seen[0], other) for other in seen)


def _no_sync_probe(ctx: idist.DistContext, strategy: str) -> tuple[tuple[bool, bool], tuple[bool, bool]]:
    """Gradients after backward passes inside nested no_sync blocks (each rank its own data), then after one outside."""
    model, _ = make(ctx, strategy)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(ctx.rank))

    def backward() -> None:
        model(x).pow(2).mean().backward()

    with ctx.no_sync(model):
        with ctx.no_sync(model):
            backward()
        backward()  # the inner block has ended, the outer one has not: still no exchange
        inside = _grads(ctx, model)
    backward()
    return inside, _grads(ctx, model)


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    return run_ranks(_rank, 2, timeout=240)


def _serial(epochs: int, accumulate: int = 1) -> dict[str, list[float]]:
    with idist.context("serial") as ctx:
        model, opt = make(ctx, "fsdp")  # one process: the model stays whole
        assert type(model) is Net
        run_epochs(ctx, model, opt, 0, epochs, accumulate)
        return full_state(model, opt)


def test_two_fsdp_ranks_train_like_one_process(two_ranks: list[dict[str, Any]]) -> None:
    single = _serial(EPOCHS)
    for r in two_ranks:
        assert_close(r["fsdp"], single)
        assert_close(r["blocks"], single)
        assert r["rewrap"]


def test_each_fsdp_rank_holds_half_of_the_state(two_ranks: list[dict[str, Any]]) -> None:
    for r in two_ranks:
        params, states = r["fraction"]
        assert 0.45 <= params <= 0.55 and 0.45 <= states <= 0.55, r["fraction"]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_accumulation_under_no_sync_steps_like_one_process(two_ranks: list[dict[str, Any]], strategy: str) -> None:
    single = _serial(2, accumulate=K)
    plain = _serial(2)
    for r in two_ranks:
        assert_close(r[f"accumulate_{strategy}"], single)
    with pytest.raises(AssertionError):
        assert_close(single, plain)  # accumulating is not the same as stepping every batch


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_accumulation_under_no_sync_exchanges_nothing_inside_nested_blocks(
    two_ranks: list[dict[str, Any]], strategy: str
) -> None:
    for r in two_ranks:
        inside, after = r[f"no_sync_{strategy}"]
        # DDP keeps each rank's own gradients; FSDP holds them unsharded, out of .grad, until the synced backward
        assert inside == ((True, False) if strategy == "ddp" else (False, False)), inside
        assert after == (True, True)


def test_bad_fsdp_options_raise_on_every_rank(two_ranks: list[dict[str, Any]]) -> None:
    for r in two_ranks:
        assert "matches no submodule of Net" in r["no_match"] and "Block" in r["no_match"]
        assert "drop mesh=" in r["mesh"]
        assert "'ddp', 'fsdp'" in r["strategy"]


def test_simulated_ranks_cannot_shard() -> None:
    def fn(ctx: idist.DistContext) -> str:
        return _error(lambda: ctx.auto_model(Net(), strategy="fsdp"))

    for message in simulate(2, fn):
        assert "needs one process per rank" in message


def test_serial_no_sync_changes_nothing() -> None:
    with idist.context("serial") as ctx:
        model = nn.Linear(2, 1)
        with ctx.no_sync(model), idist.no_sync(model, enabled=False):
            model(torch.ones(1, 2)).sum().backward()
        assert model.weight.grad is not None
        with pytest.raises(TrainingSetupError):
            with ctx.no_sync("model"):  # type: ignore[arg-type]
                pass
