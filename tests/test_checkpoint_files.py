"""What a save may replace, and the folders a save leaves beside its path, in one process.

A save replaces only a checkpoint (a folder with DCP's ``.metadata`` and nothing but a
checkpoint's files), an empty folder or nothing; anything else at the path, the working
folder and the folders above it raise ``CheckpointPathError`` before anything is written,
and nothing is removed. Each save stages under a name of its own (its nonce), held by a
lock file: a crashed save's leftovers are removed by the next save, a running save's never.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import re
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

import idist
from idist import CheckpointNotFoundError, CheckpointPathError
from idist.checkpoint import _dcp, _publish, _replaceable

NONCE = re.compile(r"^\.ck\.idist-(tmp|lock)-[0-9a-f]{32}$")


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(3, 2)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _user_folder(root: Path) -> dict[str, bytes]:
    (root / "notes").mkdir(parents=True)
    (root / "notes" / "thesis.txt").write_text("three years of work")
    (root / "train.py").write_text("print('hello')\n")
    return _tree(root)


def _settled(folder: Path) -> list[str]:
    _publish.wait_removals()
    return sorted(p.name for p in folder.iterdir())


def test_a_folder_of_the_users_files_is_kept_and_named(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    before = _user_folder(runs)
    with pytest.raises(CheckpointPathError) as info:
        idist.save_checkpoint(runs, {"model": _model(), "epoch": 1})
    text = str(info.value)
    assert "is not a checkpoint" in text and "notes" in text and "train.py" in text
    assert isinstance(info.value, OSError)
    assert _tree(runs) == before
    assert _settled(tmp_path) == ["runs"]  # no staging folder or lock left beside it


def test_a_checkpoint_with_a_file_of_the_users_inside_is_kept(tmp_path: Path) -> None:
    idist.save_checkpoint(tmp_path / "ck", {"model": _model()})
    (tmp_path / "ck" / "README.md").write_text("which run this was")
    before = _tree(tmp_path / "ck")
    with pytest.raises(CheckpointPathError, match=r"README\.md"):
        idist.save_checkpoint(tmp_path / "ck", {"model": _model(1)})
    assert _tree(tmp_path / "ck") == before


def test_the_working_folder_and_the_folders_above_it_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    before = _user_folder(project)
    monkeypatch.chdir(project)
    for path in (".", str(project), ".."):
        with pytest.raises(CheckpointPathError, match="working folder") as info:
            idist.save_checkpoint(path, {"model": _model()})
        assert str(project) in str(info.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    with pytest.raises(CheckpointPathError, match="is the working folder"):  # even an empty one
        idist.save_checkpoint(".", {"model": _model()})
    assert _tree(project) == before and list(empty.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "project"]


def test_the_folder_of_the_running_script_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "project"
    before = _user_folder(project)
    monkeypatch.setattr(sys, "argv", [str(project / "train.py")])
    with pytest.raises(CheckpointPathError, match=r"running script .*train\.py"):
        idist.save_checkpoint(project, {"model": _model()})
    assert _tree(project) == before


def test_a_file_a_symlink_and_a_folder_without_metadata_are_refused(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"user data")
    with pytest.raises(CheckpointPathError, match="is a file"):
        idist.save_checkpoint(tmp_path / "model.pt", {"model": _model()})
    idist.save_checkpoint(tmp_path / "real", {"model": _model()})
    (tmp_path / "latest").symlink_to(tmp_path / "real")
    with pytest.raises(CheckpointPathError, match="symbolic link"):
        idist.save_checkpoint(tmp_path / "latest", {"model": _model(1)})
    half = tmp_path / "half"
    half.mkdir()
    (half / "__0_0.distcp").write_bytes(b"x")
    with pytest.raises(CheckpointPathError, match=r"no \.metadata"):
        idist.save_checkpoint(half, {"model": _model()})
    assert (tmp_path / "model.pt").read_bytes() == b"user data" and (tmp_path / "latest").is_symlink()
    assert (half / "__0_0.distcp").read_bytes() == b"x"


def test_an_empty_folder_a_missing_path_and_a_dcp_folder_are_written(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    model = _model(2)
    idist.save_checkpoint(tmp_path / "empty", {"model": model})
    idist.save_checkpoint(tmp_path / "new" / "deeper", {"model": model})
    dcp.save({"model": _model(3).state_dict()}, checkpoint_id=tmp_path / "raw", no_dist=True)
    idist.save_checkpoint(tmp_path / "raw", {"model": model, "epoch": 7})
    for path in ("empty", "new/deeper", "raw"):
        fresh = _model(4)
        idist.load_checkpoint(tmp_path / path, {"model": fresh})
        assert torch.equal(fresh.weight, model.weight)
    assert _settled(tmp_path) == ["empty", "new", "raw"]


def test_each_save_stages_under_its_own_nonce_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []
    real = _dcp.write

    def spy(*args: object, **kwargs: object) -> None:
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_dcp, "write", spy)
    idist.save_checkpoint(tmp_path / "ck", {"model": _model()})
    idist.save_checkpoint(tmp_path / "ck", {"model": _model(1)})
    first, second = (set(names) - {"ck"} for names in seen)
    assert len(first) == 2 and all(NONCE.match(n) for n in first), first  # staging folder + its lock
    assert first.isdisjoint(second)
    assert _settled(tmp_path) == ["ck"]


def _leftover(folder: Path, nonce: str, files: dict[str, bytes]) -> tuple[Path, Path]:
    tmp, lock = folder / f".ck.idist-tmp-{nonce}", folder / f".ck.idist-lock-{nonce}"
    tmp.mkdir()
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    lock.write_bytes(b"")
    return tmp, lock


def test_a_crashed_saves_leftovers_go_and_a_running_saves_stay(tmp_path: Path) -> None:
    crashed = _leftover(tmp_path, "a" * 32, {"__0_0.distcp": b"half", ".idist-probe": b"a"})
    running = _leftover(tmp_path, "b" * 32, {"__0_0.distcp": b"being written"})
    odd = _leftover(tmp_path, "c" * 32, {"__0_0.distcp": b"x", "mine.txt": b"not a checkpoint file"})
    fd = os.open(running[1], os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: that save is alive
    try:
        idist.save_checkpoint(tmp_path / "ck", {"model": _model()})
        names = _settled(tmp_path)
        assert not crashed[0].exists() and not crashed[1].exists()
        assert running[0].is_dir() and running[1].exists()
        assert (running[0] / "__0_0.distcp").read_bytes() == b"being written"
        assert (odd[0] / "mine.txt").read_bytes() == b"not a checkpoint file"  # only a checkpoint's files go
        assert not (odd[0] / "__0_0.distcp").exists()
        assert names == sorted(["ck", running[0].name, running[1].name, odd[0].name])
    finally:
        os.close(fd)
    idist.save_checkpoint(tmp_path / "ck", {"model": _model(1)})
    assert _settled(tmp_path) == sorted(["ck", odd[0].name])


def test_the_only_copy_set_aside_by_a_crash_is_kept_until_a_save_publishes(tmp_path: Path) -> None:
    model = _model()
    idist.save_checkpoint(tmp_path / "ck", {"model": model})
    aside = tmp_path / f".ck.idist-old-{'d' * 32}"
    (tmp_path / "ck").rename(aside)  # a save without an atomic exchange died between its two renames
    with pytest.raises(CheckpointNotFoundError, match=rf"left the previous checkpoint at .*{aside.name}"):
        idist.load_checkpoint(tmp_path / "ck", {"model": model})
    idist.save_checkpoint(tmp_path / "ck", {"model": _model(1)})
    assert _settled(tmp_path) == ["ck"]


@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed-file", "hidden-name"])
def test_another_saves_sweep_in_the_moment_a_save_takes_its_lock_leaves_that_save_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unnamed: bool
) -> None:
    # seen as a save in one thread losing its staging folder to another's clean-up: a lock file
    # that exists unlocked marks a crashed save, and the sweep removed it, then the folder. Without
    # unnamed files the sweep removes the hidden lock file it finds unlocked: the save makes another
    if not unnamed:
        monkeypatch.setattr(os, "O_TMPFILE", 0)
    path, other = tmp_path / "ck", "f" * 32
    real_flock, swept = fcntl.flock, []

    def flock_after_a_sweep(fd: int, op: int) -> None:
        if not swept:
            swept.append(True)
            _publish.sweep(path, other)  # another save's clean-up, between this save's steps
        real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock_after_a_sweep)
    staging = _publish.stage(path, "0" * 32)
    try:
        _publish.sweep(path, other)  # and once more, now that the staging folder exists
        assert swept and staging.folder.is_dir(), sorted(os.listdir(tmp_path))
        assert _publish.sibling(path, "lock", "0" * 32).exists(), sorted(os.listdir(tmp_path))
    finally:
        _publish.discard(staging)
    assert sorted(os.listdir(tmp_path)) == []


def _die_while_taking_the_lock(path: str, unnamed: bool) -> None:
    """A save's process killed (no clean-up runs) after its lock file exists and before it is named."""
    if not unnamed:
        os.O_TMPFILE = 0  # type: ignore[misc]  # a filesystem without unnamed files: the hidden name
    fcntl.flock = lambda fd, op: os._exit(3)  # type: ignore[assignment]
    _publish.stage(Path(path), "e" * 32)


@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed-file", "hidden-name"])
def test_a_save_killed_while_it_takes_its_lock_leaves_nothing_a_sweep_keeps(tmp_path: Path, unnamed: bool) -> None:
    """Killed in the moment between creating its lock file and locking it: where the filesystem
    has unnamed files (O_TMPFILE) the file never had a name; elsewhere, the next save's sweep
    removes the hidden one once nobody holds it."""
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=_die_while_taking_the_lock, args=(str(tmp_path / "ck"), unnamed))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 3
    if unnamed:
        assert sorted(os.listdir(tmp_path)) == []
    idist.save_checkpoint(tmp_path / "ck", {"model": _model()})
    assert _settled(tmp_path) == ["ck"]


def test_threads_saving_one_path_at_once_all_succeed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    errors: list[BaseException] = []

    def saver(seed: int) -> None:
        model = nn.Linear(3, 2)
        with torch.no_grad():
            model.weight.fill_(seed)
            model.bias.fill_(seed)
        try:
            for _ in range(5):
                idist.save_checkpoint(tmp_path / "ck", {"model": model, "seed": seed})
        except BaseException as exc:
            errors.append(exc)

    for exchange in (True, False):  # renameat2(RENAME_EXCHANGE), and filesystems without it
        if not exchange:
            monkeypatch.setattr(_publish, "_exchange", lambda a, b: False)
        threads = [threading.Thread(target=saver, args=(s,)) for s in (1, 2, 3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        fresh = nn.Linear(3, 2)
        seed = idist.load_checkpoint(tmp_path / "ck", {"model": fresh})["seed"]
        assert torch.equal(fresh.weight, torch.full((2, 3), float(seed)))  # one save's, whole
        assert _settled(tmp_path) == ["ck"]


def test_a_checkpoint_published_while_a_save_checks_its_path_is_never_called_a_file(tmp_path: Path) -> None:
    """A save checks what is at its path while another save publishes there (a checkpoint renamed
    away, another renamed in): it sees a checkpoint or nothing, never a file or foreign entries."""
    ck, aside = tmp_path / "ck", tmp_path / "aside"
    idist.save_checkpoint(ck, {"model": nn.Linear(3, 2)})
    stop = threading.Event()

    def publish() -> None:
        while not stop.is_set():
            os.rename(ck, aside)
            os.rename(aside, ck)

    flipper = threading.Thread(target=publish)
    flipper.start()
    try:
        for _ in range(3000):
            _replaceable.check(ck)
    finally:
        stop.set()
        flipper.join(10)
