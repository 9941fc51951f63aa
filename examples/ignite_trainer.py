"""pytorch-ignite's Engine driven by idist: ignite runs the loops, idist the distribution.

    .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 examples/ignite_trainer.py

idist sets up the process group and adapts model, optimizer and data; ignite's
``create_supervised_trainer`` / ``create_supervised_evaluator`` run the loops, and its
metrics reduce across ranks over the same torch.distributed group. Prints the final
validation accuracy on rank 0 (``--min-accuracy`` makes a too-low result fail).
"""

from __future__ import annotations

import argparse

import torch
from ignite.engine import Engine, Events, create_supervised_evaluator, create_supervised_trainer
from ignite.metrics import Accuracy, Loss
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import idist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--min-accuracy", type=float, default=0.0)
    args = p.parse_args()

    with idist.context() as ctx:  # gloo under torchrun, serial under plain python
        x, y = load_digits(return_X_y=True)
        images, labels = torch.tensor(x, dtype=torch.float32) / 16.0, torch.tensor(y)
        train_set = TensorDataset(images[:1500], labels[:1500])
        val_set = TensorDataset(images[1500:], labels[1500:])

        torch.manual_seed(0)
        model = ctx.auto_model(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)))
        optimizer = ctx.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        train_loader = ctx.auto_dataloader(train_set, batch_size=64, shuffle=True)
        val_loader = ctx.auto_dataloader(val_set, batch_size=128)

        loss_fn = nn.CrossEntropyLoss()
        trainer = create_supervised_trainer(model, optimizer, loss_fn, device=ctx.device)
        evaluator = create_supervised_evaluator(
            model, metrics={"accuracy": Accuracy(), "loss": Loss(loss_fn)}, device=ctx.device
        )

        @trainer.on(Events.EPOCH_COMPLETED)
        def validate(engine: Engine) -> None:
            metrics = evaluator.run(val_loader).metrics  # reduced across ranks by ignite
            if ctx.rank == 0:
                print(f"epoch {engine.state.epoch}: val accuracy {metrics['accuracy']:.3f} loss {metrics['loss']:.4f}")

        trainer.run(train_loader, max_epochs=args.epochs)
        accuracy = evaluator.state.metrics["accuracy"]
        if ctx.rank == 0 and accuracy < args.min_accuracy:
            raise SystemExit(f"accuracy {accuracy:.3f} < {args.min_accuracy}")


if __name__ == "__main__":
    main()
