"""auto_dataloader on XLA (``XlaWorld``, XLA CPU device threads) keeps the native loader's promises.

torch_xla's device loader reads the CPU loader ahead of the model on a thread of its own; what
the user consumes is what counts: a look at one batch changes nothing, ``state_dict()`` is where
the model stands, each batch's gradient weight is its own, and a dataset error is raised.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

if importlib.util.find_spec("torch_xla") is None:
    pytest.skip("torch_xla is not installed (the XLA lane runs these)", allow_module_level=True)

import idist
from idist.testing import RankFailedError
from idist.testing._xla_world import XlaWorld

from . import cases_spawn

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore:.* samples in global batches of .* leave a last step:UserWarning"),
]

N, GLOBAL, SEED, EPOCHS = 22, 6, 7, 3  # 4 steps, the last one short (4 samples)


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"xla@{n}")
def world(request: pytest.FixtureRequest) -> Iterator[XlaWorld]:
    w = XlaWorld(request.param, timeout=300)
    yield w
    w.close()


def _loader(ctx: idist.DistContext) -> DataLoader[tuple[torch.Tensor, ...]]:
    return ctx.auto_dataloader(TensorDataset(torch.arange(N)), batch_size=GLOBAL, shuffle=True, seed=SEED)


def _epochs(ctx: idist.DistContext, peek: bool) -> list[list[list[int]]]:
    loader = _loader(ctx)
    if peek and ctx.rank == 0:
        x: torch.Tensor = next(iter(loader))[0]
        assert x.device.type == "xla"  # a look at one batch, on rank 0 only
    return [[b[0].cpu().tolist() for b in loader] for _ in range(EPOCHS)]


def test_a_look_at_one_batch_changes_nothing(world: XlaWorld) -> None:
    serial = _loader(idist.current())  # one process, no look
    one_process = [[b[0].tolist() for b in serial] for _ in range(EPOCHS)]
    assert one_process[0] != one_process[1]  # reshuffled epoch by epoch
    plain, peeked = world.run(_epochs, False), world.run(_epochs, True)
    assert peeked == plain
    for epoch in range(EPOCHS):
        steps = [sorted(i for r in plain for i in r[epoch][k]) for k in range(len(one_process[epoch]))]
        assert steps == [sorted(b) for b in one_process[epoch]], epoch


def _state_mid_pass(ctx: idist.DistContext) -> tuple[dict[str, object], list[list[int]], dict[str, object]]:
    loader = _loader(ctx)
    it = iter(loader)
    next(it)
    next(it)  # two steps taken; the device loader has read further ahead
    state = dict(loader.state_dict())
    resumed = _loader(ctx)
    resumed.load_state_dict(loader.state_dict())
    rest = [b[0].cpu().tolist() for b in resumed]
    del it  # the pass is left early: the loader forgets it
    return state, rest, dict(loader.state_dict())


def test_state_dict_is_where_the_model_stands(world: XlaWorld) -> None:
    one_process = [b[0].tolist() for b in _loader(idist.current())]
    results = world.run(_state_mid_pass)
    for state, _, after in results:
        assert state == {"epoch": 0, "samples": 2 * GLOBAL, "global_batch": GLOBAL}
        assert after == {"epoch": 0, "samples": 0, "global_batch": GLOBAL}
    rest = [sorted(i for r in results for i in r[1][k]) for k in range(len(one_process) - 2)]
    assert rest == [sorted(b) for b in one_process[2:]]


def _train(ctx: idist.DistContext, n: int) -> list[float]:
    g = torch.Generator().manual_seed(11)
    model = ctx.auto_model(torch.nn.Linear(3, 1))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((torch.rand(p.shape, generator=g) - 0.5).to(p.device))
    opt = ctx.auto_optim(torch.optim.SGD(model.parameters(), lr=0.5))
    xs = torch.linspace(-1, 1, 3 * n).reshape(n, 3)
    loader = ctx.auto_dataloader(TensorDataset(xs, xs.sum(1, keepdim=True) ** 2), batch_size=GLOBAL, shuffle=True)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    ctx.sync()
    return [float(v) for p in model.parameters() for v in p.detach().cpu().reshape(-1)]


@pytest.mark.parametrize("n", [22, 19])  # last step 4 samples (2, 2 / 2, 1, 1); 1 (others empty)
def test_an_uneven_last_step_trains_like_one_process(world: XlaWorld, n: int) -> None:
    expected = _train(idist.current(), n)  # one process (serial)
    got = world.run(_train, n)
    assert all(g == got[0] for g in got)
    assert got[0] == pytest.approx(expected, abs=1e-6)


class _Breaks(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == N - 1:
            raise ValueError(f"sample {i} is corrupt")
        return torch.tensor([i])


def _read_all(ctx: idist.DistContext) -> int:
    return sum(1 for _ in ctx.auto_dataloader(_Breaks(), batch_size=GLOBAL))


def test_a_dataset_error_is_raised_not_an_early_end(world: XlaWorld) -> None:
    with pytest.raises(RankFailedError) as info:
        world.run(_read_all)
    assert "sample 21 is corrupt" in str(info.value)


def _rebuilt_by_ignite(ctx: idist.DistContext) -> tuple[list[list[list[int]]], list[list[int]]]:
    from ignite.engine.deterministic import ReproducibleBatchSampler, update_dataloader

    loader = _loader(ctx)
    rebuilt = update_dataloader(loader, ReproducibleBatchSampler(loader.batch_sampler))  # type: ignore[arg-type]
    assert type(rebuilt) is type(loader)
    passes = [[b[0].cpu().tolist() for b in rebuilt] for _ in range(2)]
    assert next(iter(rebuilt))[0].device.type == "xla"
    rebuilt.batch_sampler.start_iteration = 1  # type: ignore[union-attr]  # ignite's resume, in epoch 2
    return passes, [b[0].cpu().tolist() for b in rebuilt]


def test_ignite_update_dataloader_rebuilds_the_device_loader(world: XlaWorld) -> None:
    serial = _loader(idist.current())
    one_process = [[sorted(b[0].tolist()) for b in serial] for _ in range(3)]
    results = world.run(_rebuilt_by_ignite)
    for epoch in range(2):
        steps = [sorted(i for r in results for i in r[0][epoch][k]) for k in range(len(one_process[0]))]
        assert steps == one_process[epoch], epoch
    resumed = [sorted(i for r in results for i in r[1][k]) for k in range(len(one_process[2]) - 1)]
    assert resumed == one_process[2][1:]


@pytest.mark.timeout(300)
def test_loader_workers_keep_the_epoch_after_a_look() -> None:
    """With DataLoader workers (persistent or not) too, a look at one batch changes nothing. Real
    replicas under torch_xla.launch: ``XlaWorld``'s process is a daemon, which workers cannot be."""
    n = 10  # 3 steps of global batch 4, the last one short
    serial = idist.auto_dataloader(torch.utils.data.TensorDataset(torch.arange(n)), batch_size=4, shuffle=True)
    expected = [[sorted(b[0].tolist()) for b in serial] for _ in range(2)]
    r0, r1 = idist.spawn("xla-tpu", cases_spawn.loader_passes, (n,), nproc_per_node=2)
    for setting in range(3):
        for epoch in range(2):
            steps = [sorted(a + b) for a, b in zip(r0[setting][epoch], r1[setting][epoch], strict=True)]
            assert steps == expected[epoch], (setting, epoch)
