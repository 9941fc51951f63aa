"""Checkpoints on real gloo processes: independent of the world size and the strategy, atomic,
all or nothing, and raised on every rank.

Saved by 2 FSDP ranks and by 2 DDP ranks, loaded by 3 DDP / FSDP ranks and by one plain
process: the weights and the Adam state are the saved ones exactly, and training goes on
like an uninterrupted single process. A rank that fails (or is SIGKILLed) mid-save leaves
the previous checkpoint whole; bad paths and mismatched states raise on every rank; ranks
that read different saves are told. Two jobs saving one path at once all succeed, and a
load meanwhile reads one save whole.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystemWriter

import idist
from idist import (
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointPathError,
    CheckpointStateError,
)
from idist.checkpoint import _publish
from multiproc import run_ranks
from sharding_cases import Net, assert_close, full_state, make, run_epochs

SAVED_AT, STOP = 2, 4


def _save_rank(rank: int, folder: str) -> dict[str, Any]:
    ctx = idist.initialize("gloo", timeout=60)
    try:
        out = {}
        for strategy in ("fsdp", "ddp"):
            model, opt = make(ctx, strategy)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
            run_epochs(ctx, model, opt, 0, SAVED_AT)
            sched.step()
            state = {"model": model, "optim": opt, "sched": sched, "epoch": SAVED_AT, "tag": f"{strategy} é✓"}
            idist.save_checkpoint(Path(folder) / f"{strategy}2", state)
            out[strategy] = full_state(model, opt)
        return out
    finally:
        idist.finalize()


def _resume(ctx: idist.DistContext, strategy: str, path: Path) -> dict[str, Any]:
    model, opt = make(ctx, strategy, seed=1)  # other weights than the saved ones
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    state = {"model": model, "optim": opt, "sched": sched, "epoch": 0}
    values = ctx.load_checkpoint(path, state)
    loaded = full_state(model, opt)
    run_epochs(ctx, model, opt, state["epoch"], STOP)
    return {
        "loaded": loaded, "final": full_state(model, opt), "values": dict(values), "epoch": state["epoch"],
        "lr": opt.param_groups[0]["lr"], "sched": sched.state_dict()["last_epoch"],
    }  # fmt: skip


def _resume_rank(rank: int, folder: str) -> dict[str, Any]:
    ctx = idist.initialize("gloo", timeout=60)
    try:
        return {
            "ddp2->fsdp3": _resume(ctx, "fsdp", Path(folder) / "ddp2"),
            "fsdp2->ddp3": _resume(ctx, "ddp", Path(folder) / "fsdp2"),
        }
    finally:
        idist.finalize()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("ckpt")
    saved = run_ranks(_save_rank, 2, str(folder), timeout=240)
    resumed = run_ranks(_resume_rank, 3, str(folder), timeout=240)
    with idist.context("serial") as ctx:
        serial = _resume(ctx, "ddp", folder / "fsdp2")
        model, opt = make(ctx, "ddp")
        run_epochs(ctx, model, opt, 0, STOP)
        uninterrupted = full_state(model, opt)
    return {"folder": folder, "saved": saved, "resumed": resumed, "serial": serial, "uninterrupted": uninterrupted}


def test_the_folder_holds_dcp_files_and_the_plain_values(runs: dict[str, Any]) -> None:
    names = sorted(p.name for p in (runs["folder"] / "fsdp2").iterdir())
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp", "idist-values.pt", "idist.json"]
    assert sorted(p.name for p in runs["folder"].iterdir()) == ["ddp2", "fsdp2"]  # no staging folder left


@pytest.mark.parametrize(("case", "source"), [("ddp2->fsdp3", "ddp"), ("fsdp2->ddp3", "fsdp")])
def test_three_ranks_load_what_two_saved_and_train_on(runs: dict[str, Any], case: str, source: str) -> None:
    saved = runs["saved"][0][source]
    for r in runs["resumed"]:
        assert_close(r[case]["loaded"], saved, atol=0)
        assert_close(r[case]["final"], runs["uninterrupted"])
        assert r[case]["epoch"] == SAVED_AT
        assert r[case]["values"] == {"epoch": SAVED_AT, "tag": f"{source} é✓"}
        assert r[case]["sched"] == 1 and r[case]["lr"] == 0.01


def test_one_plain_process_loads_what_fsdp_saved_and_trains_on(runs: dict[str, Any]) -> None:
    assert_close(runs["serial"]["loaded"], runs["saved"][0]["fsdp"], atol=0)
    assert_close(runs["serial"]["final"], runs["uninterrupted"])


def test_ddp_and_fsdp_checkpoints_hold_the_same_training(runs: dict[str, Any]) -> None:
    assert_close(runs["saved"][0]["fsdp"], runs["saved"][1]["ddp"])


# ---------------------------------------------------------------------------- failures
def _outcome(fn: Any) -> str:
    try:
        fn()
    except BaseException as exc:  # a CheckpointException (a BaseException) must never get here
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def _fault_rank(rank: int, folder: str) -> dict[str, Any]:
    root = Path(folder)
    ctx = idist.initialize("gloo", timeout=60)
    out: dict[str, Any] = {}
    try:
        model, opt = make(ctx, "ddp")
        good = {"model": model, "optim": opt, "epoch": 1}
        idist.save_checkpoint(root / "ck", good)
        before = full_state(model, opt)
        out["unpicklable"] = _outcome(
            lambda: idist.save_checkpoint(root / "ck", {**good, "hook": (lambda: 1) if rank == 1 else 1})
        )
        real_write = FileSystemWriter.write_data

        def full_disk(self: Any, *args: Any) -> Any:
            if rank == 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(self, *args)

        FileSystemWriter.write_data = full_disk  # type: ignore[method-assign]
        out["full_disk"] = _outcome(lambda: idist.save_checkpoint(root / "ck", good))
        FileSystemWriter.write_data = real_write  # type: ignore[method-assign]
        ctx.barrier()  # rank 0 removes the staging folder after every rank learned the save failed
        out["after"] = sorted(p.name for p in root.iterdir())
        out["local_disk"] = _outcome(lambda: idist.save_checkpoint(root / f"node{rank}" / "ck", good))
        ctx.barrier()
        out["local_files"] = sorted(str(p.relative_to(root)) for p in root.glob("node*/**/*") if p.is_file())
        out["missing"] = _outcome(lambda: idist.load_checkpoint(root / "nothing", good))
        out["missing_here"] = _outcome(lambda: idist.load_checkpoint(root / ("ck" if rank == 0 else "nothing"), good))
        other, other_opt = make(ctx, "ddp", seed=3)
        untouched = full_state(other, other_opt)
        wide_state = {"model": ctx.auto_model(Net(out=3), strategy="fsdp"), "epoch": 0}  # another shape, sharded
        out["mismatch"] = _outcome(lambda: idist.load_checkpoint(root / "ck", {**wide_state, "other": 1}))
        loaded = idist.load_checkpoint(root / "ck", wide_state, strict=False)
        out["skipped"] = (list(loaded.skipped.missing), list(loaded.skipped.mismatched), wide_state["epoch"])
        out["wrong_optimizer"] = _outcome(lambda: idist.load_checkpoint(root / "ck", {"optim": other_opt}))
        out["untouched"] = full_state(other, other_opt) == untouched
        reloaded = make(ctx, "ddp", seed=5)
        idist.load_checkpoint(root / "ck", {"model": reloaded[0], "optim": reloaded[1]})
        out["intact"] = full_state(*reloaded) == before
        out.update(_same_save_and_stateful(ctx, root, rank, good))
        return out
    finally:
        idist.finalize()


class _Flaky:
    """A stateful object whose load fails on one rank only."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def state_dict(self) -> dict[str, int]:
        return {"n": 1}

    def load_state_dict(self, state: Any) -> None:
        if self.fail:
            raise ValueError("cannot take this state")


def _same_save_and_stateful(ctx: idist.DistContext, root: Path, rank: int, good: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    idist.save_checkpoint(root / "ck2", good)  # the same state saved again: another save
    if rank == 1:
        shutil.copytree(root / "ck", root / "copy")  # a copy of the same save, e.g. on a node's own disk
    ctx.barrier()
    fresh, fresh_opt = make(ctx, "ddp", seed=7)
    untouched = full_state(fresh, fresh_opt)
    state = {"model": fresh, "optim": fresh_opt}
    out["other_save"] = _outcome(lambda: idist.load_checkpoint(root / ("ck" if rank == 0 else "ck2"), state))
    out["other_save_untouched"] = full_state(fresh, fresh_opt) == untouched
    out["same_save"] = _outcome(lambda: idist.load_checkpoint(root / ("ck" if rank == 0 else "copy"), state))
    model, opt = good["model"], good["optim"]
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3)
    sched.step()
    idist.save_checkpoint(root / "ck3", {"model": model, "sched": sched, "flaky": _Flaky(False)})
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5)
    sched_before, weights_before = sched.state_dict(), full_state(fresh, fresh_opt)
    out["stateful"] = _outcome(
        lambda: idist.load_checkpoint(root / "ck3", {"model": fresh, "sched": sched, "flaky": _Flaky(rank == 1)})
    )
    out["stateful_back"] = sched.state_dict() == sched_before and full_state(fresh, fresh_opt) == weights_before
    return out


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(_fault_rank, 2, str(tmp_path_factory.mktemp("faults")), timeout=240)


def test_an_unpicklable_value_on_one_rank_fails_every_rank(faults: list[dict[str, Any]]) -> None:
    for r in faults:
        assert r["unpicklable"].startswith(f"{CheckpointStateError.__name__}: ")
        assert "rank 1" in r["unpicklable"] and "state['hook'] cannot be pickled" in r["unpicklable"]


def test_a_full_disk_on_one_rank_fails_every_rank_and_keeps_the_old_checkpoint(faults: list[dict[str, Any]]) -> None:
    for r in faults:
        assert r["full_disk"].startswith(f"{CheckpointError.__name__}: ")
        assert "rank 1" in r["full_disk"] and "No space left on device" in r["full_disk"]
        assert r["after"] == ["ck"]  # the staging folder is gone
        assert r["intact"]


def test_a_path_not_every_rank_sees_is_found_before_writing(faults: list[dict[str, Any]]) -> None:
    for r in faults:
        assert r["local_disk"].startswith(f"{CheckpointPathError.__name__}: ")
        assert "rank 1" in r["local_disk"] and "rank 0:" not in r["local_disk"]
        assert "shared by all nodes" in r["local_disk"] and "every rank must pass the same path" in r["local_disk"]
        assert r["local_files"] == []  # no data, no probe, no staging folder


def test_a_missing_checkpoint_raises_file_not_found_on_every_rank(faults: list[dict[str, Any]]) -> None:
    for r in faults:
        assert r["missing"].startswith(f"{CheckpointNotFoundError.__name__}: ")
        assert "every rank" in r["missing"]
        assert r["missing_here"].startswith(f"{CheckpointNotFoundError.__name__}: ")
        assert "failed on rank 1: no checkpoint at" in r["missing_here"]
    assert issubclass(CheckpointNotFoundError, FileNotFoundError)


def test_a_mismatched_state_raises_with_the_names_and_changes_nothing(faults: list[dict[str, Any]]) -> None:
    for r in faults:
        assert r["mismatch"].startswith(f"{CheckpointMismatchError.__name__}: ")
        for name in ("other", "model.out.weight: checkpoint [2, 16], state [3, 16]", "model.out.bias"):
            assert name in r["mismatch"]
        assert r["wrong_optimizer"].startswith(f"{CheckpointStateError.__name__}: ")
        assert r["untouched"]


def test_ranks_that_read_different_saves_are_told_and_nothing_changes(faults: list[dict[str, Any]]) -> None:
    for r in faults:
        assert r["other_save"].startswith(f"{CheckpointMismatchError.__name__}: "), r["other_save"]
        assert "the ranks read different checkpoints" in r["other_save"]
        assert re.search(
            r"rank 0 read save [0-9a-f]{12} at \S+/ck; rank 1 read save [0-9a-f]{12} at \S+/ck2", r["other_save"]
        )
        assert r["other_save_untouched"]
        assert r["same_save"] == "ok"  # per-rank paths holding the same save load


def test_a_stateful_object_failing_on_one_rank_changes_nothing_anywhere(faults: list[dict[str, Any]]) -> None:
    for r in faults:
        assert r["stateful"].startswith(f"{CheckpointError.__name__}: ") and "rank 1" in r["stateful"]
        assert "cannot take this state" in r["stateful"] and "nothing was changed" in r["stateful"]
        assert r["stateful_back"]  # rank 0's scheduler had loaded: it was put back


def test_strict_false_loads_what_matches_and_says_what_it_skipped(faults: list[dict[str, Any]]) -> None:
    for r in faults:
        missing, mismatched, epoch = r["skipped"]
        assert missing == []
        assert [m.split(":")[0] for m in mismatched] == ["model.out.weight", "model.out.bias"]
        assert epoch == 1


def _killed_rank(rank: int, folder: str, victim: int) -> str:
    root = Path(folder)
    ctx = idist.initialize("gloo", timeout=60)
    try:
        model, opt = make(ctx, "fsdp")
        idist.save_checkpoint(root / "ck", {"model": model, "optim": opt, "epoch": 1})
        run_epochs(ctx, model, opt, 0, 1)
        real_write = FileSystemWriter.write_data

        def die_midway(self: Any, *args: Any) -> Any:
            if rank == victim:
                os.kill(os.getpid(), signal.SIGKILL)
            return real_write(self, *args)

        FileSystemWriter.write_data = die_midway  # type: ignore[method-assign]
        return _outcome(lambda: idist.save_checkpoint(root / "ck", {"model": model, "optim": opt, "epoch": 2}))
    finally:
        idist.finalize()


@pytest.mark.parametrize("victim", [0, 1])
def test_sigkill_of_one_rank_mid_save_leaves_the_previous_checkpoint_loadable(tmp_path: Path, victim: int) -> None:
    results = run_ranks(_killed_rank, 2, str(tmp_path), victim, timeout=120, may_die=frozenset({victim}))
    assert results[victim] == ("died", -signal.SIGKILL)
    outcome = results[1 - victim]
    assert outcome.split(":")[0] in ("PeerLostError", "GroupBrokenError", "CheckpointError"), outcome
    # rank 0 makes and publishes the staging folder: killed, it leaves it (and its lock) for the next save to remove
    assert bool(list(tmp_path.glob(".ck.idist-tmp-*"))) == (victim == 0)
    with idist.context("serial") as ctx:
        model, opt = make(ctx, "ddp", seed=7)
        state = {"model": model, "optim": opt, "epoch": 0}
        ctx.load_checkpoint(tmp_path / "ck", state)
        fresh = make(ctx, "ddp")
        assert state["epoch"] == 1 and full_state(model, opt) == full_state(*fresh)
        ctx.save_checkpoint(tmp_path / "ck", state)
    _publish.wait_removals()  # the replaced checkpoint is removed in the background
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


# ---------------------------------------------------------------------------- concurrent saves
SAVES = 25


def _saver(job: int, folder: str) -> int:
    """One of two jobs (one process each, no process group) saving the same path over and over."""
    model = nn.Linear(16, 16)
    with idist.context("serial") as ctx:
        for i in range(SAVES):
            tag = (job + 1) * 1000 + i
            with torch.no_grad():
                for p in model.parameters():
                    p.fill_(tag)  # every tensor of a save holds its tag: a mix shows
            ctx.save_checkpoint(Path(folder) / "ck", {"model": model, "tag": tag})
    _publish.wait_removals()
    return SAVES


def test_two_jobs_saving_one_path_at_once_all_succeed_and_never_mix(tmp_path: Path) -> None:
    done, saved = threading.Event(), []

    def jobs() -> None:
        try:
            saved.append(run_ranks(_saver, 2, str(tmp_path), timeout=240, set_launcher_env=False))
        finally:
            done.set()

    thread = threading.Thread(target=jobs)
    thread.start()
    loads, refused = 0, []
    while not done.is_set():  # meanwhile, this process loads what is there
        fresh = nn.Linear(16, 16)
        try:
            tag = idist.load_checkpoint(tmp_path / "ck", {"model": fresh})["tag"]
        except CheckpointError as exc:  # none yet, or the save it read was removed under it: never a mix
            refused.append(str(exc))
        else:
            assert all(torch.equal(p, torch.full_like(p, tag)) for p in fresh.parameters()), tag
            loads += 1
        done.wait(0.02)  # leave the savers most of the 2 cores
    thread.join()
    assert saved == [[SAVES, SAVES]]  # every save of both jobs returned normally
    assert loads > 0, refused[:3]
    fresh = nn.Linear(16, 16)
    tag = idist.load_checkpoint(tmp_path / "ck", {"model": fresh})["tag"]
    assert tag % 1000 == SAVES - 1 and torch.equal(fresh.weight, torch.full((16, 16), float(tag)))  # a last save
    _publish.wait_removals()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
