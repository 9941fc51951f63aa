"""One training run that every backend's equivalence test shares (imported by the ranks).

``train(ctx, n, global_batch, epochs)`` trains a small regression model with auto_model,
auto_optim and auto_dataloader and returns its final weights (plain floats), the sample
indices each epoch saw, and whether the global RNG was left alone. Run on N ranks at
global batch B, the weights must equal a single process's at batch B.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

import idist


class Regression(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """A fixed synthetic regression set; each item also carries its index."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 6, generator=g)
        self.y = self.x @ torch.randn(6, 2, generator=g) + 0.1 * torch.randn(n, 2, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[i], self.y[i], i


def make_model(flag: bool = False) -> nn.Module:
    """A 6 -> 16 -> 2 MLP; ``flag`` adds a bool buffer (which Horovod cannot broadcast itself)."""
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    if flag:
        model.register_buffer("flag", torch.tensor([True, False]))
    return model


def train(
    ctx: idist.DistContext, n: int, global_batch: int, epochs: int, *,
    drop_last: bool = False, optim: str = "sgd", seed: int = 0, flag: bool = False, peek: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Train from ``seed``'s initial weights (auto_model must give every rank rank 0's)."""
    torch.manual_seed(seed)
    model = make_model(flag)
    if flag and seed != 0:
        model.get_buffer("flag").copy_(torch.tensor([False, True]))
    model = ctx.auto_model(model)
    rng_after_init = torch.get_rng_state()
    params = model.parameters()
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9) if optim == "sgd" else torch.optim.Adam(params, lr=0.01)
    opt = ctx.auto_optim(opt)
    loader = ctx.auto_dataloader(Regression(n), batch_size=global_batch, shuffle=True, drop_last=drop_last)
    if peek and ctx.rank == 0:
        next(iter(loader))  # a look at one batch, on one rank: changes nothing
    seen: list[list[int]] = []
    for _ in range(epochs):  # no set_epoch anywhere
        order: list[int] = []
        for x, y, idx in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            order += idx.tolist()
        seen.append(order)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    # plain values: tensors through a multiprocessing queue need the sender alive
    return {
        "weights": weights.tolist(),
        "seen": seen,
        "rng_untouched": torch.equal(torch.get_rng_state(), rng_after_init),
        "flag": model.get_buffer("flag").tolist() if flag else None,
        "opt_type": type(opt).__mro__[1].__name__ if ctx.backend == "horovod" else type(opt).__name__,
    }


def fresh_model(seed: int = 0) -> nn.Module:
    """``make_model()`` with weights from a private generator (threads share torch's global RNG)."""
    model = make_model()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model


def documented_loop(
    ctx: idist.DistContext, n: int, global_batch: int, *, accumulate: int = 1, strategy: str = "ddp",
    epochs: int = 2, even_batches: bool = False,
) -> list[float]:  # fmt: skip
    """The loop docs/training.md promises exact: a mean loss, auto_model, auto_optim, auto_dataloader,
    and (``accumulate`` > 1) gradient accumulation under no_sync, stepping every ``accumulate`` batches."""
    model = ctx.auto_model(fresh_model(), strategy=strategy)  # type: ignore[call-overload]
    opt = ctx.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1))
    loader = ctx.auto_dataloader(Regression(n), batch_size=global_batch, shuffle=True, even_batches=even_batches)
    for _ in range(epochs):
        for i, (x, y, _idx) in enumerate(loader):
            with ctx.no_sync(model, enabled=(i + 1) % accumulate != 0):  # type: ignore[attr-defined]
                (nn.functional.mse_loss(model(x), y) / accumulate).backward()
            if (i + 1) % accumulate == 0:
                opt.step()
                opt.zero_grad()
    return [v for p in model.state_dict().values() for v in _full(p).flatten().tolist()]


def _full(t: torch.Tensor) -> torch.Tensor:
    """A parameter's whole value (an FSDP parameter is a DTensor holding this rank's shard)."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t.detach()


def extra_pass_alone(ctx: idist.DistContext) -> str:
    """Rank 0 takes a whole pass over the training loader alone; checked mode must catch it."""
    from idist import TrainingSetupError  # the ranks import this module before idist is set up

    model = ctx.auto_model(fresh_model())
    opt = ctx.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1))
    loader = ctx.auto_dataloader(Regression(32), batch_size=8, shuffle=True)

    def epoch() -> None:
        for x, y, _idx in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    epoch()
    if ctx.rank == 0:
        for _batch in loader:  # e.g. training-set metrics on rank 0 only
            pass
    try:
        epoch()
    except TrainingSetupError as exc:
        return str(exc)
    return "no error"


def ignite_run(ctx: idist.DistContext, n: int, global_batch: int, epochs: int, resume_at: int = 0) -> dict[str, Any]:
    """pytorch-ignite's DeterministicEngine over an auto_dataloader, with ignite's set_epoch handler.

    ``resume_at`` > 0 resumes the run at that iteration, as ignite does from a checkpoint.
    """
    import warnings

    from ignite.engine import DeterministicEngine, Events

    model = ctx.auto_model(fresh_model())
    opt = ctx.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1))
    loader = ctx.auto_dataloader(Regression(n), batch_size=global_batch, shuffle=True)
    seen: list[int] = []

    def step(engine: Any, batch: Any) -> None:
        x, y, idx = batch
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        seen.extend(idx.tolist())

    engine = DeterministicEngine(step)

    @engine.on(Events.EPOCH_STARTED)
    def _set_epoch(e: Any) -> None:  # ignite's distrib_set_epoch (contrib.engines.common)
        loader.sampler.set_epoch(e.state.epoch - 1)  # type: ignore[attr-defined]

    if resume_at:
        state = {"iteration": resume_at, "epoch_length": len(loader), "max_epochs": epochs, "rng_states": None}
        engine.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine.run(loader, max_epochs=epochs)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {"weights": weights.tolist(), "seen": seen, "steps": len(loader)}
