"""What every rank gathers to report a failure stays bounded, whatever the messages and the world size.

Simulated ranks (threads): a checkpoint step, a ``one_rank_first`` leader, ``agree`` and the
checked-mode place check. A rank's 10 MB message reaches every rank cut to a few hundred
bytes, without any rank receiving megabytes; a report of many failed ranks names the first
few and counts the rest. The bytes are counted where the native backend gathers them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import idist
from failing_loads import FailsOnce, counting_gathers, load_failing
from idist import LeaderFailedError, TrainingSetupError
from idist.testing import simulate
from idist.training._agree import agree

#: a message far past any bound: 10 MB
BIG = 10 * 2**20
#: what a report may take in all, and the most one gather may bring to a rank in these worlds
REPORT_LIMIT = 8 * 1024
GATHER_LIMIT = 64 * 1024


def _load_failing(tmp_path: Path, world_size: int, message: dict[int, str]) -> list[tuple[str, str]]:
    """Every rank's error when rank r's stateful object raises ``message[r]`` during a load."""
    idist.save_checkpoint(tmp_path / "ck", {"obj": FailsOnce()})
    return load_failing(tmp_path / "ck", world_size, message)


def test_a_ten_megabyte_error_reaches_every_rank_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = counting_gathers(monkeypatch)
    outcomes = _load_failing(tmp_path, 3, {1: "disk on fire: " + "x" * BIG + " (the end)"})
    assert len(set(outcomes)) == 1, "every rank raises the same error"
    name, message = outcomes[0]
    assert name == "CheckpointError"
    assert "failed on rank 1: ValueError: disk on fire: xxx" in message
    assert "(the end)" in message and "bytes left out" in message
    assert "nothing was changed" in message
    assert len(message.encode()) < REPORT_LIMIT
    assert sizes and max(sizes) < GATHER_LIMIT


def test_a_report_of_many_failed_ranks_names_the_first_and_counts_the_rest(tmp_path: Path) -> None:
    every = _load_failing(tmp_path, 10, {r: f"part {r} is broken" for r in range(10)})
    assert len(set(every)) == 1
    message = every[0][1]
    assert "failed on 10 of 10 ranks:" in message
    for r in range(4):
        assert f"  rank {r}: ValueError: part {r} is broken" in message
    assert "part 4 is broken" not in message
    assert "and 6 more ranks, with 6 other messages" in message

    same = _load_failing(tmp_path, 10, dict.fromkeys(range(1, 10), "no space left"))
    assert len(set(same)) == 1
    listed = ", ".join(f"rank {r}" for r in range(1, 9))
    assert f"failed on {listed} and 1 more rank: ValueError: no space left" in same[0][1]

    assert _load_failing(tmp_path, 10, dict.fromkeys(range(10), "no space left"))[0][1].startswith(
        f"loading checkpoint {tmp_path / 'ck'} failed on every rank: ValueError: no space left"
    )


def test_a_leaders_ten_megabyte_error_reaches_its_followers_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = counting_gathers(monkeypatch)

    def fn(ctx: idist.DistContext) -> str:
        try:
            with ctx.one_rank_first():
                if ctx.rank == 0:
                    raise OSError("download failed: " + "y" * BIG + " (the end)")
        except LeaderFailedError as exc:
            return str(exc)
        except OSError as exc:
            return f"leader: {len(str(exc))}"
        return "ran"

    leader, *followers = simulate(3, fn)
    assert leader == f"leader: {len('download failed: ') + BIG + len(' (the end)')}"  # its own exception, whole
    for message in followers:
        assert message.startswith("rank 0 raised inside one_rank_first, so rank ")
        assert "OSError: download failed: yyy" in message and "(the end)" in message
        assert len(message.encode()) < REPORT_LIMIT
    assert max(sizes) < GATHER_LIMIT


def test_agree_gathers_a_digest_and_names_the_first_ranks_that_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = counting_gathers(monkeypatch)
    layout = [(f"layer{i}.weight", "torch.float32", (1024, 1024)) for i in range(2000)]  # about 100 kB
    simulate(3, lambda ctx: agree(ctx, "the model's parameters and buffers", layout))
    assert max(sizes) < GATHER_LIMIT

    def fn(ctx: idist.DistContext) -> str:
        try:
            agree(ctx, "the model's parameters and buffers", layout if ctx.rank == 0 else layout[1:])
        except TrainingSetupError as exc:
            return str(exc)
        return "agreed"

    messages = simulate(11, fn)
    assert len(set(messages)) == 1
    listed = ", ".join(map(str, range(1, 9)))
    assert f"differs between ranks (rank 0 vs ranks {listed} and 2 more)" in messages[0]


def test_the_checked_place_check_names_the_first_ranks_at_each_place() -> None:
    def fn(ctx: idist.DistContext) -> str:
        torch.manual_seed(0)
        model = ctx.auto_model(nn.Linear(2, 1))
        opt = ctx.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1))
        loader = ctx.auto_dataloader([torch.zeros(2)] * 40, batch_size=20)
        if ctx.rank > 0:
            for _ in loader:  # a pass rank 0 does not take: their epoch moves on alone
                pass
        model(next(iter(loader))).sum().backward()
        try:
            opt.step()
        except TrainingSetupError as exc:
            return str(exc)
        return "stepped"

    messages = simulate(10, fn, checked=True)
    assert len(set(messages)) == 1
    listed = ", ".join(map(str, range(1, 9)))
    assert f"(rank 0 at epoch 0 step 0; ranks {listed} and 1 more at epoch 1 step 0)" in messages[0]


class _Unpicklable:
    """A value whose pickling fails with a 10 MB message."""

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("cannot pickle: " + "y" * BIG + " (the end)")


def test_a_collectives_ten_megabyte_error_reaches_every_rank_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value error's text is cut before the error frame is agreed on (#33): no rank gathers it whole."""
    sizes = counting_gathers(monkeypatch)

    def fn(ctx: idist.DistContext) -> tuple[str, str]:
        try:
            ctx.all_gather(_Unpicklable() if ctx.rank == 1 else 1.0)
        except idist.IdistError as exc:
            return type(exc).__name__, str(exc)
        return "ok", ""

    outcomes = simulate(2, fn)
    assert len(set(outcomes)) == 1, "every rank raises the same error"
    name, message = outcomes[0]
    assert name == "UnsupportedValueError" and "does not pickle" in message
    assert "(the end)" in message and "bytes left out" in message
    assert len(message.encode()) < REPORT_LIMIT
    assert sizes and max(sizes) < GATHER_LIMIT
