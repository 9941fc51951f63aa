"""#35 item 12: the idioms the docs used to show, which the types refuse."""

from __future__ import annotations

from torch import nn

import idist


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(2, 2)


def wrap_in_place() -> Net:
    model = Net()
    # mypy keeps the first assignment's type; pyright lets the variable change type, and refuses the return
    # rejected: mypy[assignment] pyright[]
    model = idist.auto_model(model)
    # rejected: mypy[] pyright[reportReturnType]
    return model


def resume(epochs: int) -> None:
    model = Net()
    state = {"model": model, "epoch": 0}
    idist.load_checkpoint("ckpt", state)
    # rejected: mypy[call-overload] pyright[reportArgumentType]
    for _ in range(state["epoch"], epochs):
        pass
