"""Type tests for the training helpers: checked by mypy (strict), never executed."""

from __future__ import annotations

from typing import assert_type

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import idist
from idist import AutoDataLoader, NativeContext


def helpers_keep_their_types(ctx: NativeContext, ds: TensorDataset) -> None:
    sgd = torch.optim.SGD(nn.Linear(1, 1).parameters())
    assert_type(idist.auto_optim(sgd), torch.optim.SGD)
    assert_type(ctx.auto_optim(torch.optim.Adam([torch.zeros(1)])), torch.optim.Adam)
    assert_type(idist.auto_model(nn.Linear(1, 1)), nn.Module)
    assert_type(ctx.auto_dataloader(ds, batch_size=8), AutoDataLoader[tuple[torch.Tensor, ...]])
    assert_type(idist.auto_dataloader(DataLoader(ds)), AutoDataLoader[tuple[torch.Tensor, ...]])
    loader = idist.auto_dataloader(ds)
    assert_type(loader.global_batch_size, int | None)
    assert_type(loader.epoch, int | None)
    loader.set_epoch(3)
    idist.auto_optim(nn.Linear(1, 1))  # type: ignore[type-var]
    idist.auto_model(sgd)  # type: ignore[arg-type]
