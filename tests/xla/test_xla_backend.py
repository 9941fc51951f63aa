"""XlaContext on real torch_xla: XLA CPU device threads (``XlaWorld``) at world sizes 1-3.

Runs in the XLA lane (``scripts/lanes/xla.sh``, venv ``.venv-xla``); skipped where
torch_xla is not installed (the main venv). Each rank function is module-level so it
pickles into the XLA process.
"""

from __future__ import annotations

import importlib.util
import math
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

if importlib.util.find_spec("torch_xla") is None:
    pytest.skip("torch_xla is not installed (the XLA lane runs these)", allow_module_level=True)

import idist
from idist.testing import RankFailedError
from idist.testing._xla_world import XlaWorld

pytestmark = pytest.mark.timeout(900)

#: dtype -> ops it takes
CASES: dict[torch.dtype, tuple[str, ...]] = {
    torch.int64: ("SUM", "PRODUCT", "MIN", "MAX", "AND", "OR"),
    torch.int32: ("SUM", "MIN", "AND", "OR"),
    torch.uint8: ("SUM", "MAX", "OR"),
    torch.float64: ("SUM", "PRODUCT", "MIN", "MAX", "AVERAGE"),
    torch.float32: ("SUM", "AVERAGE", "MAX"),
    torch.bfloat16: ("SUM", "MIN"),
    torch.bool: ("MIN", "MAX", "AND", "OR"),
}


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda n: f"xla@{n}")
def world(request: pytest.FixtureRequest) -> Iterator[XlaWorld]:
    w = XlaWorld(request.param, timeout=300)
    yield w
    w.close()


def _value(dtype: torch.dtype, rank: int) -> torch.Tensor:
    base = torch.tensor([3, 5, 6, 12], dtype=torch.int64) + rank
    if dtype == torch.bool:
        return torch.tensor([True, rank == 0, False, rank % 2 == 0])
    if dtype == torch.int64:
        base = base + (2**40 if rank == 1 else 0)
    return base.to(dtype)


def _fold(op: str, ts: list[torch.Tensor]) -> torch.Tensor:
    acc = ts[0].clone()
    for t in ts[1:]:
        acc = {
            "SUM": lambda a, b: a + b, "AVERAGE": lambda a, b: a + b, "PRODUCT": lambda a, b: a * b,
            "MIN": torch.minimum, "MAX": torch.maximum, "AND": lambda a, b: a & b, "OR": lambda a, b: a | b,
        }[op](acc, t)  # fmt: skip
    return (acc / len(ts)).to(ts[0].dtype) if op == "AVERAGE" else acc.to(ts[0].dtype)


def reduce_everything(ctx: idist.DistContext) -> dict[str, Any]:
    out: dict[str, Any] = {"topology": (ctx.rank, ctx.world_size, ctx.device.type, ctx.model_name(), ctx.backend)}
    for dtype, ops in CASES.items():
        for op in ops:
            t = _value(dtype, ctx.rank)
            got = ctx.all_reduce(t, op)  # type: ignore[arg-type]
            out[f"{dtype}/{op}"] = (got is t, got.dtype, got.tolist())
    on_device = torch.tensor([1.0 + ctx.rank], dtype=torch.float64).to(ctx.device)
    same = ctx.all_reduce(on_device)
    out["device"] = (same is on_device, same.device.type, same.cpu().tolist())
    nan = torch.tensor([math.nan if ctx.rank == 0 else 1.0, 2.0 + ctx.rank], dtype=torch.float64)
    out["nan-min"] = [struct.pack("<d", v).hex() for v in ctx.all_reduce(nan, "MIN").tolist()]
    out["int"] = ctx.all_reduce(2**61 + ctx.rank)
    out["float"] = ctx.all_reduce(0.1 * (ctx.rank + 1))
    out["bool"] = ctx.all_reduce(ctx.rank == 0, "OR")
    return out


def test_all_reduce_matches_the_fold_exactly(world: XlaWorld) -> None:
    n = world.world_size
    results = world.run(reduce_everything)
    for rank, res in enumerate(results):
        assert res["topology"] == (rank, n, "xla", "xla-dist", "xla-tpu")
        for dtype, ops in CASES.items():
            for op in ops:
                expected = _fold(op, [_value(dtype, r) for r in range(n)])
                same, got_dtype, values = res[f"{dtype}/{op}"]
                assert same and got_dtype == dtype, (dtype, op)
                assert values == expected.tolist(), (dtype, op, values, expected)
        assert res["device"] == (True, "xla", [float(sum(1 + r for r in range(n)))])
        nan_bits = struct.pack("<d", math.nan).hex()
        assert res["nan-min"] == [nan_bits, struct.pack("<d", 2.0).hex()]
        assert res["int"] == sum(2**61 + r for r in range(n))
        assert res["float"] == sum((0.1 * (r + 1) for r in range(n)), start=0.0) or n == 1
        assert res["bool"] is True


def move_values(ctx: idist.DistContext) -> dict[str, Any]:
    r = ctx.rank
    out: dict[str, Any] = {}
    out["str"] = ctx.all_gather("héllo✓\U0001f600" * (r + 1))
    out["bytes"] = ctx.all_gather(bytes(range(r * 7 % 256)))
    out["obj"] = ctx.all_gather({"rank": r, "set": {r}})
    out["tensors"] = [(t.dtype, t.tolist()) for t in ctx.all_gather(torch.arange(r + 1, dtype=torch.int16))]
    bits = torch.tensor([-0.0, math.inf, struct.unpack("<d", bytes.fromhex("0100000000f8ff7f"))[0]])
    mine = bits.to(torch.float64) if r == 0 else torch.full((3,), math.nan, dtype=torch.float64)
    got = ctx.broadcast(mine, 0)
    out["bits"] = [struct.pack("<d", v).hex() for v in got.tolist()]
    big = torch.arange(50_000, dtype=torch.float64) * (r + 1)
    kept = big.clone()
    got_big = ctx.broadcast(big if r == ctx.world_size - 1 else None, ctx.world_size - 1)
    out["big"] = (float(got_big.sum()), r != ctx.world_size - 1 or bool(torch.equal(big, kept)))
    out["py"] = ctx.broadcast(2**70 + 0.5 if r == 0 else None, 0)
    return out


def test_gather_and_broadcast_are_exact(world: XlaWorld) -> None:
    n = world.world_size
    src_bits = torch.tensor([-0.0, math.inf, struct.unpack("<d", bytes.fromhex("0100000000f8ff7f"))[0]])
    for res in world.run(move_values):
        assert res["str"] == ["héllo✓\U0001f600" * (r + 1) for r in range(n)]
        assert res["bytes"] == [bytes(range(r * 7 % 256)) for r in range(n)]
        assert res["obj"] == [{"rank": r, "set": {r}} for r in range(n)]
        assert res["tensors"] == [(torch.int16, list(range(r + 1))) for r in range(n)]
        assert res["bits"] == [struct.pack("<d", v).hex() for v in src_bits.to(torch.float64).tolist()]
        assert res["big"] == (float((torch.arange(50_000, dtype=torch.float64) * n).sum()), True)
        assert res["py"] == 2**70 + 0.5


def groups_and_bystanders(ctx: idist.DistContext) -> dict[str, Any]:
    r = ctx.rank
    members = sorted({0, ctx.world_size - 1})  # one rank on a world of one
    t = torch.tensor([10.0 + r])
    out: dict[str, Any] = {}
    out["tensor"] = ctx.all_reduce(t, group=members).tolist()
    out["int"] = ctx.all_reduce(100 + r, "MAX", group=members)
    out["gather"] = ctx.all_gather(f"r{r}", group=members)
    out["bcast"] = ctx.broadcast(torch.full((3,), float(r)), members[-1], group=members).tolist()
    g = ctx.new_group(members)
    out["newgroup"] = ctx.all_reduce(1, group=g)
    ctx.barrier(group=members)
    ctx.sync()
    return out


def test_groups_members_and_bystanders(world: XlaWorld) -> None:
    n = world.world_size
    members = sorted({0, n - 1})
    for r, res in enumerate(world.run(groups_and_bystanders)):
        if r in members:
            assert res["tensor"] == [sum(10.0 + m for m in members)]
            assert res["int"] == 100 + members[-1]
            assert res["gather"] == [f"r{m}" for m in members]
            assert res["bcast"] == [float(members[-1])] * 3
            assert res["newgroup"] == len(members)
        else:  # outside the group: its own input back
            assert res == {"tensor": [10.0 + r], "int": 100 + r, "gather": [f"r{r}"], "bcast": [float(r)] * 3,
                           "newgroup": 1}  # fmt: skip


def bad_inputs(ctx: idist.DistContext) -> list[str]:
    seen = []
    for call in (
        lambda: ctx.all_reduce(torch.zeros(ctx.rank + 1)),  # shapes differ between ranks
        lambda: ctx.all_reduce(torch.zeros(2, dtype=torch.float64 if ctx.rank == 0 else torch.float32)),
        lambda: ctx.all_reduce(torch.zeros(2), "AND"),  # not valid for floats
        lambda: ctx.all_gather(torch.zeros(1, dtype=torch.int32 if ctx.rank == 0 else torch.int64)),
        lambda: ctx.broadcast(1, src=ctx.world_size),
        lambda: ctx.all_reduce(1.5, "NOPE"),  # type: ignore[call-overload]
    ):
        try:
            call()
            seen.append("returned")
        except idist.IdistError as exc:
            seen.append(type(exc).__name__)
    return seen


def test_bad_input_raises_on_every_rank(world: XlaWorld) -> None:
    results = world.run(bad_inputs)
    if world.world_size == 1:  # one rank cannot disagree with itself
        assert results[0][2:] == ["UnsupportedOpError", "returned", "CollectiveInputError", "UnsupportedOpError"]
        return
    expected = ["CollectiveInputError", "CollectiveInputError", "UnsupportedOpError", "CollectiveInputError",
                "CollectiveInputError", "UnsupportedOpError"]  # fmt: skip
    assert results == [expected] * world.world_size


def template_checks(ctx: idist.DistContext) -> list[object]:
    """Calls that only the shared argument checks and checkpoint (``_check_tensor``, ``_enter``,
    ``_checkpoint``) catch: before XLA went through them, the odd rank crashed alone and its
    peers waited for it."""
    last = ctx.world_size - 1
    float8 = torch.zeros(2, dtype=torch.float8_e4m3fn if ctx.rank == 0 else torch.float32)  # no codec for float8
    meta = torch.empty(2, device="meta" if ctx.rank == last else "cpu")  # a shape without data
    not_a_group: Any = object()
    seen: list[object] = []
    for call in (
        lambda: ctx.all_reduce(float8),
        lambda: ctx.all_reduce(meta),
        lambda: ctx.all_reduce(torch.ones(1), group=not_a_group),
        lambda: ctx.all_reduce(1.0, group=not_a_group),
        lambda: ctx.all_gather(1, group=not_a_group),
        lambda: ctx.all_reduce(torch.zeros(ctx.rank + 1), group=sorted({0, last})),  # shapes differ; others stand by
    ):
        try:
            call()
            seen.append("returned")
        except idist.IdistError as exc:
            seen.append(type(exc).__name__)
    seen.append(ctx.all_reduce(torch.ones(1)).tolist())  # every rank is still in step
    return seen


def test_argument_checks_and_checkpoint_run_for_xla(world: XlaWorld) -> None:
    n = world.world_size
    bad = ["UnsupportedValueError", "UnsupportedValueError", "CollectiveInputError", "CollectiveInputError",
           "CollectiveInputError"]  # fmt: skip
    for rank, seen in enumerate(world.run(template_checks)):
        members = {0, n - 1}
        mismatch = "CollectiveInputError" if rank in members and n > 1 else "returned"
        assert seen == [*bad, mismatch, [float(n)]], rank


def _seeded_linear(seed: int) -> torch.nn.Linear:
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    with torch.no_grad():
        model.weight.copy_(torch.rand(model.weight.shape, generator=g) - 0.5)
        model.bias.copy_(torch.rand(model.bias.shape, generator=g) - 0.5)
    return model


def train_steps(ctx: idist.DistContext, steps: int) -> list[float]:
    # different initial weights: auto_model must align them (rank 0's win). From a generator
    # of this thread's own: the replicas are threads, torch.manual_seed would be shared.
    model = ctx.auto_model(_seeded_linear(1234 + ctx.rank))
    opt = ctx.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1))
    data = torch.utils.data.TensorDataset(torch.arange(48.0).reshape(12, 4) / 48, torch.arange(12.0).reshape(12, 1))
    loader = ctx.auto_dataloader(data, batch_size=4 * ctx.world_size, shuffle=False)
    for _ in range(steps):
        for x, y in loader:
            assert x.device.type == "xla"
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    ctx.sync()
    return [float(v) for v in torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()])]


def test_training_keeps_replicas_identical_and_matches_one_process(world: XlaWorld) -> None:
    n = world.world_size
    params = world.run(train_steps, 2)
    assert all(p == params[0] for p in params)
    # One CPU process on the global batches takes the same steps (up to float32 rounding).
    model = _seeded_linear(1234)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = torch.arange(48.0).reshape(12, 4) / 48, torch.arange(12.0).reshape(12, 1)
    for _ in range(2):
        for i in range(0, 12, 4 * n):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xs[i : i + 4 * n]), ys[i : i + 4 * n]).backward()
            opt.step()
    expected = [float(v) for v in torch.cat([p.detach().reshape(-1) for p in model.parameters()])]
    assert params[0] == pytest.approx(expected, rel=1e-5, abs=1e-5)


def fails_on_rank_last(ctx: idist.DistContext) -> int:
    if ctx.rank == ctx.world_size - 1:
        raise ValueError("boom")
    return ctx.rank


def test_a_failing_rank_is_named(world: XlaWorld) -> None:
    with pytest.raises(RankFailedError) as info:
        world.run(fails_on_rank_last)
    assert info.value.rank == world.world_size - 1


def rank_and_size(ctx: idist.DistContext) -> tuple[int, int]:
    return ctx.rank, ctx.world_size


def test_the_xla_process_leaves_the_temporary_folder_as_it_found_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch before 2.10 makes a folder there at ``import torch.distributed.nn`` and removes it at
    exit; the XLA process ends with ``os._exit``, so idist removes it first."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))  # the XLA process is spawned: it reads TMPDIR
    with XlaWorld(2, timeout=300) as world:
        assert world.run(rank_and_size) == [(0, 2), (1, 2)]
    assert list(folder.iterdir()) == []
