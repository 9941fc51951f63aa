"""Basic distributed training setup with idist: one script, any launcher.

Run as one process (``python examples/basic_setup.py``), or under torchrun / ``idist run``
with several: ``idist.initialize()`` reads the launcher's environment, and the three
``auto_*`` calls adapt the model, optimizer and data to whatever it found.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import idist


def main() -> None:
    idist.initialize()  # serial here; gloo/nccl under a launcher
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(512, 10, generator=g)
        y = x @ torch.randn(10, 1, generator=g)
        train_loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)

        torch.manual_seed(0)
        model = idist.auto_model(nn.Linear(10, 1))
        optimizer = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=0.05))
        train_loader = idist.auto_dataloader(train_loader)  # batch_size 32 is the global batch

        for epoch in range(3):
            total, count = 0.0, 0
            for xb, yb in train_loader:
                xb, yb = xb.to(idist.device()), yb.to(idist.device())
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(xb), yb)
                loss.backward()
                optimizer.step()
                total, count = total + loss.item() * len(yb), count + len(yb)
            mean = idist.all_reduce(total) / idist.all_reduce(count)
            if idist.get_rank() == 0:
                print(f"epoch {epoch}: loss {mean:.4f} ({idist.get_world_size()} process(es), {idist.backend()})")
    finally:
        idist.finalize()


if __name__ == "__main__":
    main()
