"""XLA/TPU training: one script for a TPU VM, an XLA GPU, or the XLA CPU device.

Each replica (a device thread or process that torch_xla starts) opens its own
``XlaContext`` with ``idist.context("xla-tpu")``; ``auto_model`` puts rank 0's weights on
every replica's device, ``auto_optim`` averages the gradients in ``step()``, and
``auto_dataloader`` gives each replica its share of every global batch, already on the
device. Run it with::

    PJRT_DEVICE=CPU CPU_NUM_DEVICES=2 python examples/xla_training.py   # 2 replicas on the CPU
    PJRT_DEVICE=TPU python examples/xla_training.py                      # every TPU core

It prints the loss per epoch on rank 0 and checks that every replica ends with the same
weights. Needs torch_xla (``scripts/xla/setup-venv.sh`` builds ``.venv-xla``).
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils.data import TensorDataset

import idist

EPOCHS = 3
GLOBAL_BATCH = 32


def training(index: int) -> None:
    with idist.context("xla-tpu") as ctx:
        torch.manual_seed(0)
        x = torch.randn(256, 8)
        y = (x @ torch.linspace(-1, 1, 8)).unsqueeze(1) + 0.01 * torch.randn(256, 1)
        model = ctx.auto_model(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
        optimizer = ctx.auto_optim(torch.optim.SGD(model.parameters(), lr=0.05))
        loader = ctx.auto_dataloader(TensorDataset(x, y), batch_size=GLOBAL_BATCH, shuffle=True)
        for epoch in range(EPOCHS):
            total, batches = torch.zeros((), device=ctx.device), 0
            for xb, yb in loader:
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(xb), yb)
                loss.backward()
                optimizer.step()
                total += loss.detach()
                batches += 1
            ctx.sync()
            mean = ctx.all_reduce(total.cpu() / batches, "AVERAGE")
            if ctx.rank == 0:
                print(f"epoch {epoch}: loss {float(mean):.4f} on {ctx.world_size} {ctx.device_type} replica(s)")
        weights = torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()])
        copies = ctx.all_gather(weights)
        if not all(torch.equal(c, copies[0]) for c in copies):
            raise SystemExit(f"replica {ctx.rank}: weights differ between replicas")
        if ctx.rank == 0:
            print(f"{ctx.world_size} replica(s) agree on all {weights.numel()} weights")


def main() -> None:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    # a collective parks one runtime thread per device until all arrive
    os.environ.setdefault("XLA_THREAD_POOL_SIZE", "32")
    import torch_xla

    torch_xla.launch(training)


if __name__ == "__main__":
    main()
