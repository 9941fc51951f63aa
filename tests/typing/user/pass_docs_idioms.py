"""#35 item 12, accepted: the idioms the docs teach."""

from __future__ import annotations

from typing import reveal_type

import torch
from torch import nn

import idist


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(x)
        return out


def wrap(ctx: idist.DistContext) -> Net:
    net = Net()
    model = ctx.auto_model(net)  # net, or the DDP wrapping it: train through model
    model(torch.ones(1, 2)).sum().backward()
    return net  # net's own attributes (net.head): through net


def train(epochs: int) -> None:
    net = Net()
    model = idist.auto_model(net)  # net itself, or the DDP / DataParallel wrapping it
    reveal_type(model)  # revealed: Net | DistributedDataParallel | DataParallel[Net]
    opt = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1))
    state = {"model": model, "optim": opt, "epoch": 0}
    start: int = idist.load_checkpoint("ckpt", state)["epoch"]
    for epoch in range(start, epochs):
        state["epoch"] = epoch + 1
    reveal_type(net.head)  # revealed: Linear
