"""Checkpoints in one process: serial contexts and simulated ranks (threads), and the CLI.

Round trips of modules, optimizers, stateful objects and plain values; publishing by
rename (with and without an atomic exchange), all-or-nothing loads and their errors
(what a save may replace and its staging folders: test_checkpoint_files.py); a
checkpoint written by replicated simulated ranks loads on another world size;
``idist checkpoint info|convert``.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter

import idist
from idist import (
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointStateError,
)
from idist._cli import main as cli
from idist.checkpoint import Loaded, Skipped, _dcp, _publish
from idist.testing import simulate


def _trained(seed: int = 0, steps: int = 3) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(5, 4)).pow(2).mean().backward()
        opt.step()
        sched.step()
    return model, opt, sched


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, dict):
            if not _same(x, y):
                return False
        elif isinstance(x, torch.Tensor):
            if not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


def test_a_serial_round_trip_restores_everything(tmp_path: Path) -> None:
    model, opt, sched = _trained()
    note = "héllo ✓ " * 3
    idist.save_checkpoint(tmp_path / "ck", {"model": model, "optim": opt, "sched": sched, "epoch": 3, "note": note})
    m2, o2, s2 = _trained(seed=1, steps=0)
    state: dict[str, Any] = {"model": m2, "optim": o2, "sched": s2, "epoch": 0}
    loaded = idist.load_checkpoint(tmp_path / "ck", state)
    assert isinstance(loaded, Loaded) and dict(loaded) == {"epoch": 3, "note": note}
    assert loaded.skipped == Skipped() and not loaded.skipped
    assert state["epoch"] == 3  # plain values of a mutable state are replaced
    assert _same(m2.state_dict(), model.state_dict())
    assert _same(o2.state_dict(), opt.state_dict())
    assert s2.state_dict() == sched.state_dict()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_a_second_save_replaces_the_first_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, _, _ = _trained()
    for exchange in (True, False):  # renameat2(RENAME_EXCHANGE), and filesystems without it
        if not exchange:
            monkeypatch.setattr(_publish, "_exchange", lambda a, b: False)
        idist.save_checkpoint(tmp_path / "ck", {"model": model, "step": 1})
        other, _, _ = _trained(seed=2)
        idist.save_checkpoint(tmp_path / "ck", {"model": other, "step": 2})
        fresh, _, _ = _trained(seed=3, steps=0)
        assert idist.load_checkpoint(tmp_path / "ck", {"model": fresh})["step"] == 2
        assert _same(fresh.state_dict(), other.state_dict())
        _publish.wait_removals()  # the replaced checkpoint is removed in the background
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_missing_and_foreign_folders_raise_file_not_found(tmp_path: Path) -> None:
    model, _, _ = _trained()
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        idist.load_checkpoint(tmp_path / "nothing", {"model": model})
    (tmp_path / "folder").mkdir()
    with pytest.raises(CheckpointNotFoundError, match=r"not a checkpoint folder \(no \.metadata"):
        idist.load_checkpoint(tmp_path / "folder", {"model": model})


def test_a_mismatch_names_every_key_and_changes_nothing(tmp_path: Path) -> None:
    model, opt, _ = _trained()
    idist.save_checkpoint(tmp_path / "ck", {"model": model, "optim": opt, "epoch": 1})
    torch.manual_seed(5)
    wider = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3), nn.Linear(3, 1))
    wider_opt = torch.optim.Adam(wider.parameters())
    before = {k: v.clone() for k, v in wider.state_dict().items()}
    with pytest.raises(CheckpointMismatchError) as info:
        idist.load_checkpoint(tmp_path / "ck", {"model": wider, "optim": wider_opt, "lr": 0.1})
    text = str(info.value)
    for name in ("model.3.weight", "model.3.bias", "lr", "model.2.weight: checkpoint [2, 8], state [3, 8]"):
        assert name in text
    assert isinstance(info.value, ValueError) and "strict=False" in text
    assert _same(wider.state_dict(), before) and not wider_opt.state  # the optimizer stays fresh too
    loaded = idist.load_checkpoint(tmp_path / "ck", {"model": wider, "optim": wider_opt}, strict=False)
    assert "model.3.weight" in loaded.skipped.missing
    model_keys = [m.split(":")[0] for m in loaded.skipped.mismatched if m.startswith("model.")]
    assert model_keys == ["model.2.weight", "model.2.bias"]
    assert loaded.skipped.unexpected == ()  # the scheduler's initial_lr is a setting, and settings load whole
    assert torch.equal(wider[0].weight, model[0].weight)  # what matches is loaded
    assert torch.equal(wider[2].weight, before["2.weight"])
    assert not wider_opt.state  # an optimizer is never loaded in part
    narrower = nn.Sequential(nn.Linear(4, 8))
    with pytest.raises(CheckpointMismatchError, match=r"unexpected \(2\): model\.2\.weight, model\.2\.bias"):
        idist.load_checkpoint(tmp_path / "ck", {"model": narrower})


def test_an_entry_the_state_does_not_name_is_left_in_the_checkpoint(tmp_path: Path) -> None:
    model, opt, _ = _trained()
    idist.save_checkpoint(tmp_path / "ck", {"model": model, "optim": opt})
    fresh, _, _ = _trained(seed=4, steps=0)
    assert not idist.load_checkpoint(tmp_path / "ck", {"model": fresh}).skipped  # the model alone, for inference
    assert _same(fresh.state_dict(), model.state_dict())


def test_an_optimizer_saved_before_its_first_step_resumes_fresh(tmp_path: Path) -> None:
    model, _, _ = _trained(steps=0)
    opt = torch.optim.Adam(model.parameters())
    idist.save_checkpoint(tmp_path / "ck", {"model": model, "optim": opt})
    assert not opt.state  # saving did not step it
    m2, _, _ = _trained(seed=1, steps=0)
    o2 = torch.optim.Adam(m2.parameters(), lr=0.5)
    idist.load_checkpoint(tmp_path / "ck", {"model": m2, "optim": o2})
    assert not o2.state and o2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_states_that_cannot_work_raise_before_anything_is_written(tmp_path: Path) -> None:
    model, opt, _ = _trained()
    with pytest.raises(CheckpointStateError, match=r"state\['hook'\] cannot be pickled"):
        idist.save_checkpoint(tmp_path / "ck", {"model": model, "hook": lambda: 1})
    with pytest.raises(CheckpointStateError, match="updates parameters of no single module"):
        idist.save_checkpoint(tmp_path / "ck", {"optim": opt})
    with pytest.raises(CheckpointStateError, match=r"without '\.'"):
        idist.save_checkpoint(tmp_path / "ck", {"my.model": model})
    with pytest.raises(CheckpointStateError, match="must be a mapping"):
        idist.save_checkpoint(tmp_path / "ck", [model])  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_truncated_or_corrupt_file_raises_a_checkpoint_error(tmp_path: Path) -> None:
    model, _, _ = _trained()
    idist.save_checkpoint(tmp_path / "ck", {"model": model})
    data = tmp_path / "ck" / "__0_0.distcp"
    size = data.stat().st_size
    data.write_bytes(b"\0" * 16)
    fresh, _, _ = _trained(seed=9, steps=0)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(CheckpointError, match=rf"__0_0\.distcp holds 16 bytes, its metadata names {size}"):
        idist.load_checkpoint(tmp_path / "ck", {"model": fresh})
    assert _same(fresh.state_dict(), before)  # found before any tensor is read
    data.write_bytes(b"\0" * size)  # the right size, and garbage: found by torch while reading
    sched = torch.optim.lr_scheduler.StepLR(torch.optim.SGD(fresh.parameters()), step_size=9)
    sched_before = sched.state_dict()
    with pytest.raises(CheckpointError) as info:  # never torch's CheckpointException, a BaseException
        idist.load_checkpoint(tmp_path / "ck", {"model": fresh, "sched": sched}, strict=False)
    assert "torch.distributed.checkpoint on rank 0" in str(info.value)
    assert "may hold part of the checkpoint" in str(info.value) and "stateful objects" in str(info.value)
    assert sched.state_dict() == sched_before  # the scheduler, loaded first, was put back


class _Refuses:
    def state_dict(self) -> dict[str, int]:
        return {"x": 1}

    def load_state_dict(self, state: dict[str, int]) -> None:
        raise ValueError("this state is not for me")


def test_a_stateful_object_that_fails_to_load_changes_nothing(tmp_path: Path) -> None:
    model, opt, sched = _trained()
    idist.save_checkpoint(tmp_path / "ck", {"model": model, "optim": opt, "sched": sched, "bad": _Refuses(), "e": 3})
    m2, o2, s2 = _trained(seed=1, steps=0)
    before, sched_before = {k: v.clone() for k, v in m2.state_dict().items()}, s2.state_dict()
    state: dict[str, Any] = {"model": m2, "optim": o2, "sched": s2, "bad": _Refuses(), "e": 0}
    with pytest.raises(CheckpointError, match="this state is not for me") as info:
        idist.load_checkpoint(tmp_path / "ck", state)
    assert "nothing was changed" in str(info.value)
    assert _same(m2.state_dict(), before) and not o2.state and state["e"] == 0
    assert s2.state_dict() == sched_before  # loaded before the failing one, then put back


def _filled(value: float) -> nn.Module:
    model = nn.Linear(3, 2)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    return model


def test_a_load_reads_one_save_while_another_publishes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    idist.save_checkpoint(tmp_path / "ck", {"model": _filled(1.0), "tag": 1})
    real_read, real_remove = _dcp.read, _publish.remove_checkpoint

    def publish_meanwhile(*args: Any) -> None:
        # between the load's checks and its reading of the tensors, another save publishes at
        # the path (and, here, has not removed the folder it replaced yet)
        monkeypatch.setattr(_publish, "remove_checkpoint", lambda folder: False)
        idist.save_checkpoint(tmp_path / "ck", {"model": _filled(2.0), "tag": 2})
        _publish.wait_removals()
        real_read(*args)

    monkeypatch.setattr(_dcp, "read", publish_meanwhile)
    fresh = nn.Linear(3, 2)
    assert idist.load_checkpoint(tmp_path / "ck", {"model": fresh})["tag"] == 1
    assert torch.equal(fresh.weight, torch.ones(2, 3))  # the first save's tensors with its values: no mix
    monkeypatch.setattr(_dcp, "read", real_read)
    assert idist.load_checkpoint(tmp_path / "ck", {"model": fresh})["tag"] == 2
    assert torch.equal(fresh.weight, torch.full((2, 3), 2.0))
    for leftover in tmp_path.glob(".ck.idist-*"):
        real_remove(leftover)


def test_a_checkpoint_written_by_dcp_alone_loads(tmp_path: Path) -> None:
    model, _, _ = _trained()
    dcp.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "raw", no_dist=True)
    fresh, _, _ = _trained(seed=3, steps=0)
    assert dict(idist.load_checkpoint(tmp_path / "raw", {"model": fresh})) == {}
    assert _same(fresh.state_dict(), model.state_dict())


# simulated ranks share the process's global RNG: every model is built here, in the main thread
REPLICA = _trained()
FRESH = [_trained(seed=r + 1, steps=0) for r in range(3)]


def _simulated_save(ctx: idist.DistContext, folder: Path) -> int:
    model, opt, sched = REPLICA  # the same replica on every simulated rank
    ctx.save_checkpoint(folder / "ck", {"model": model, "optim": opt, "sched": sched, "rank": ctx.rank})
    return len(list((folder / "ck").iterdir()))


def _simulated_load(ctx: idist.DistContext, folder: Path) -> tuple[bool, int]:
    model, opt, _ = REPLICA
    fresh, fresh_opt, fresh_sched = FRESH[ctx.rank]
    loaded = ctx.load_checkpoint(folder / "ck", {"model": fresh, "optim": fresh_opt, "sched": fresh_sched})
    same = _same(fresh.state_dict(), model.state_dict()) and _same(fresh_opt.state_dict(), opt.state_dict())
    return same, loaded["rank"]


def test_simulated_ranks_save_once_and_load_on_another_world_size(tmp_path: Path) -> None:
    assert simulate(3, _simulated_save, tmp_path) == [4, 4, 4]
    assert simulate(2, _simulated_load, tmp_path) == [(True, 0), (True, 0)]
    with idist.context("serial") as ctx:
        assert _simulated_load(ctx, tmp_path) == (True, 0)


#: the calls a load makes that each cost a metadata operation on a shared filesystem (opens aside:
#: DCP opens the data files each rank reads, as a raw dcp.load does)
_METADATA_CALLS = ("stat", "lstat", "scandir", "listdir")


def _count_metadata_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every file or folder that ``os`` is asked about from now on, in every thread."""
    seen: list[str] = []
    for name in _METADATA_CALLS:
        original = getattr(os, name)

        def counting(path: Any = ".", *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            seen.append(os.path.basename(os.fsdecode(path)) if isinstance(path, (str, bytes, os.PathLike)) else "")
            return _original(path, *args, **kwargs)

        monkeypatch.setattr(os, name, counting)
    return seen


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # dcp.save without a group, on purpose
def test_a_load_asks_the_filesystem_about_each_data_file_once_in_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(8)))
    writer = FileSystemWriter(tmp_path / "ck", thread_count=8)  # 8 data files, as 8 saving ranks would write
    dcp.save({"model": model.state_dict()}, storage_writer=writer, no_dist=True)
    files = sorted(p.name for p in (tmp_path / "ck").glob("*.distcp"))
    assert len(files) == 8

    def load(ctx: idist.DistContext) -> bool:
        fresh = nn.Sequential(*(nn.Linear(4, 4) for _ in range(8)))
        ctx.load_checkpoint(tmp_path / "ck", {"model": fresh})
        return _same(fresh.state_dict(), model.state_dict())

    calls = {}
    for world_size in (1, 2, 4):
        seen = _count_metadata_calls(monkeypatch)
        assert simulate(world_size, load) == [True] * world_size
        monkeypatch.undo()
        assert sorted(name for name in seen if name.endswith(".distcp")) == files, "each data file once, by one rank"
        calls[world_size] = len(seen)
    per_rank = calls[2] - calls[1]
    assert calls[4] - calls[2] == 2 * per_rank, f"a constant number of other calls per rank: {calls}"
    assert per_rank <= 4, calls


def test_a_copy_of_the_save_that_lacks_data_fails_every_rank_before_anything_changes(tmp_path: Path) -> None:
    idist.save_checkpoint(tmp_path / "ck", {"model": _filled(1.0)})
    shutil.copytree(tmp_path / "ck", tmp_path / "copy")  # a node's own copy, say, that lost a file
    (tmp_path / "copy" / "__0_0.distcp").unlink()
    models = [_filled(9.0) for _ in range(2)]

    def fn(ctx: idist.DistContext) -> str:
        try:
            ctx.load_checkpoint(tmp_path / ("ck" if ctx.rank == 0 else "copy"), {"model": models[ctx.rank]})
        except CheckpointError as exc:
            return str(exc)
        return "loaded"

    for message in simulate(2, fn):
        assert f"failed on rank 1: the checkpoint at {tmp_path / 'copy'} lacks __0_0.distcp" in message
        assert "nothing was changed" in message
    assert all(torch.equal(m.weight, torch.full((2, 3), 9.0)) for m in models)


def test_simulated_ranks_that_read_different_saves_are_told(tmp_path: Path) -> None:
    idist.save_checkpoint(tmp_path / "a", {"model": _filled(1.0)})
    idist.save_checkpoint(tmp_path / "b", {"model": _filled(1.0)})  # the same state: another save all the same
    shutil.copytree(tmp_path / "a", tmp_path / "a-copy")  # the same save, elsewhere
    for name in ("raw1", "raw2"):
        dcp.save({"model": _filled(1.0).state_dict()}, checkpoint_id=tmp_path / name, no_dist=True)
    shutil.copytree(tmp_path / "raw1", tmp_path / "raw1-copy")
    models = [_filled(9.0) for _ in range(2)]

    def fn(ctx: idist.DistContext, paths: tuple[str, str]) -> str:
        try:
            ctx.load_checkpoint(tmp_path / paths[ctx.rank], {"model": models[ctx.rank]})
        except CheckpointMismatchError as exc:
            return str(exc)
        return "ok"

    for message in simulate(2, fn, ("a", "b")):
        assert re.search(r"rank 0 read save [0-9a-f]{12} at \S+/a; rank 1 read save [0-9a-f]{12} at \S+/b", message)
        assert "nothing was changed" in message
    assert all(torch.equal(m.weight, torch.full((2, 3), 9.0)) for m in models)
    assert "rank 1 read save dcp-" in simulate(2, fn, ("raw1", "raw2"))[1]  # DCP alone wrote them: by their metadata
    assert simulate(2, fn, ("a", "a-copy")) == ["ok", "ok"]
    assert simulate(2, fn, ("raw1", "raw1-copy")) == ["ok", "ok"]


def test_a_failure_on_one_simulated_rank_fails_every_rank(tmp_path: Path) -> None:
    def fn(ctx: idist.DistContext) -> str:
        model = REPLICA[0]
        path = tmp_path / ("ck" if ctx.rank != 1 else "elsewhere") / "ck"
        try:
            ctx.load_checkpoint(path, {"model": model})
        except CheckpointNotFoundError as exc:
            return str(exc)
        return "no error"

    model, _, _ = _trained()
    idist.save_checkpoint(tmp_path / "ck" / "ck", {"model": model})
    for message in simulate(3, fn):
        assert "failed on rank 1: no checkpoint at" in message


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "idist", "checkpoint", *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.slow
def test_the_cli_lists_and_converts_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, opt, sched = _trained()
    idist.save_checkpoint(tmp_path / "ck", {"model": model, "optim": opt, "sched": sched, "epoch": 4})
    info = _cli("info", str(tmp_path / "ck"))
    assert info.returncode == 0, info.stderr
    lines = info.stdout.splitlines()
    assert "saved by serial on 1 rank(s)" in lines[1]
    assert "model (module): 4 tensors, 58 elements" in lines
    assert "  2.weight  float32  [2, 8]  64 B" in lines
    assert "  state.0.weight.exp_avg  float32  [8, 4]  128 B" in lines
    assert "epoch (value, int): 4" in lines
    assert any(line.startswith("sched (stateful): {") for line in lines)
    out = tmp_path / "whole" / "model.pt"
    conv = _cli("convert", str(tmp_path / "ck"), str(out))
    assert conv.returncode == 0, conv.stderr
    whole = torch.load(out, weights_only=False)
    assert sorted(whole) == ["epoch", "model", "optim", "sched"] and whole["epoch"] == 4
    fresh, _, _ = _trained(seed=3, steps=0)
    fresh.load_state_dict(whole["model"])
    assert _same(fresh.state_dict(), model.state_dict())
    (tmp_path / "ck" / ".metadata").write_bytes(pickle.dumps(_Mkdir(tmp_path / "pwned")))
    hostile = _cli("info", str(tmp_path / "ck"))  # a file it refuses: named in one line, no traceback
    assert hostile.returncode == 1 and "Traceback" not in hostile.stderr and "epoch (value, int): 4" in hostile.stdout
    assert hostile.stderr.startswith("idist: error: refused") and hostile.stderr.count("\n") == 1
    assert not (tmp_path / "pwned").exists()
    assert cli(["checkpoint", "info", str(tmp_path / "nothing")]) == 2
    assert "idist: error: no checkpoint at" in capsys.readouterr().err


class _Mkdir:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.path),))
