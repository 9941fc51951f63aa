"""auto_model and auto_optim: serial, DDP on in-process gloo ranks, bad options."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

import idist
from idist import TrainingSetupError
from test_training_loader import on_ranks


def test_serial_model_is_unchanged_and_options_are_ignored() -> None:
    model = nn.Linear(3, 2)
    assert idist.auto_model(model) is model
    assert idist.auto_model(model, sync_bn=True, find_unused_parameters=True) is model


def test_a_wrapped_model_is_never_wrapped_twice() -> None:
    inner = nn.Linear(3, 2)
    dp = DataParallel(inner)
    assert idist.auto_model(dp) is dp

    def run(ctx: idist.DistContext) -> bool:
        ddp = ctx.auto_model(nn.Linear(3, 2))
        return isinstance(ddp, DistributedDataParallel) and ctx.auto_model(ddp) is ddp

    assert on_ranks(2, run) == [True, True]


def test_ddp_on_in_process_ranks_averages_gradients() -> None:
    def run(ctx: idist.DistContext) -> tuple[list[float], list[float], str]:
        torch.manual_seed(ctx.rank)  # different initial weights: DDP must broadcast rank 0's
        model = ctx.auto_model(nn.Linear(3, 1, bias=False))
        inner = model.module if isinstance(model, DistributedDataParallel) else model
        start = inner.weight.detach().flatten().tolist()
        model(torch.full((2, 3), float(ctx.rank + 1))).sum().backward()
        assert inner.weight.grad is not None
        return start, inner.weight.grad.flatten().tolist(), type(model).__name__

    (w0, g0, k0), (w1, g1, k1) = on_ranks(2, run)
    assert k0 == k1 == "DistributedDataParallel"
    assert w0 == w1
    assert g0 == g1 == [3.0, 3.0, 3.0]  # mean of 2*1 and 2*2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"device_ids": [0]}, "auto_model sets device_ids itself"),
        ({"output_device": 0}, "auto_model sets output_device itself"),
        ({"sync_bn": True}, "sync_bn=True needs GPU devices"),
    ],
)
def test_bad_model_options_raise_on_every_rank(kwargs: dict[str, Any], match: str) -> None:
    def run(ctx: idist.DistContext) -> str:
        with pytest.raises(TrainingSetupError, match=match):
            ctx.auto_model(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)), **kwargs)
        return "raised"

    assert on_ranks(2, run) == ["raised", "raised"]


def test_not_a_module_or_optimizer_is_refused() -> None:
    with pytest.raises(TrainingSetupError, match=r"torch\.nn\.Module"):
        idist.auto_model("model")  # type: ignore[arg-type]
    with pytest.raises(TrainingSetupError, match=r"torch\.optim\.Optimizer"):
        idist.auto_optim(object())  # type: ignore[type-var]


def test_optimizer_unchanged_on_serial_and_native() -> None:
    opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    assert idist.auto_optim(opt) is opt
    assert idist.auto_optim(opt, backward_passes_per_step=2) is opt  # Horovod's option: ignored here

    def run(ctx: idist.DistContext) -> bool:
        o = torch.optim.Adam(nn.Linear(2, 2).parameters())
        return ctx.auto_optim(o) is o

    assert on_ranks(2, run) == [True, True]


def test_ddp_frees_its_reducer_before_its_group() -> None:
    """The group outlives the Reducer when the model is freed (see wrap_ddp): no exit hang."""
    from idist._backends.native._ddp import KEEPALIVE

    def run(ctx: idist.DistContext) -> list[str]:
        return list(vars(ctx.auto_model(nn.Linear(2, 2))))

    for names in on_ranks(2, run):
        assert names.index(KEEPALIVE) > names.index("reducer")


# ------------------------------------------------ the same arguments everywhere (issue 32, item 12)
def _outcome(ctx: idist.DistContext, kwargs: dict[str, Any]) -> str:
    try:
        ctx.auto_model(nn.Linear(2, 2), **kwargs)
    except TrainingSetupError as exc:
        return f"refused: {exc}"
    return "accepted"


@pytest.mark.parametrize(
    ("kwargs", "accepted"),
    [
        ({"bogus_option": 1}, False),
        ({"device_ids": None}, True),
        ({"device_ids": None, "output_device": None}, True),
        ({"device_ids": [0]}, False),
        ({"find_unused_parameters": True}, True),
        ({"strategy": "fsdp", "reshard_after_forward": False}, True),
        ({"strategy": "fsdp", "bucket_cap_mb": 25}, False),
    ],
)
def test_auto_model_accepts_or_refuses_the_same_arguments_on_one_and_two_ranks(
    kwargs: dict[str, Any], accepted: bool
) -> None:
    serial = _outcome(idist.current(), kwargs)
    if "strategy" in kwargs:  # FSDP cannot run on threads: its refusal of them is not about the arguments
        ranks = [serial, serial]
    else:
        ranks = on_ranks(2, lambda ctx: _outcome(ctx, kwargs))
    assert [serial, *ranks] == ["accepted"] * 3 if accepted else all(o.startswith("refused") for o in [serial, *ranks])
    if not accepted and "bogus_option" in kwargs:
        assert "bogus_option" in serial and "find_unused_parameters" in serial  # names the valid ones
