"""A save's own folders beside its path: staging under its nonce, the lock, publishing, removals.

A save with nonce N writes into ``.NAME.idist-tmp-N``. Rank 0 holds ``.NAME.idist-lock-N``
(``flock``) from before that folder exists until the save has removed what it replaced, so
a lock nobody holds marks a crashed save. Publishing is one rename: an atomic exchange
where the filesystem has one (Linux ``renameat2``), else the checkpoint at the path moves to
``.NAME.idist-old-N`` first. After publishing, rank 0 removes (in a thread) what it replaced
and crashed saves' leftovers: a checkpoint's files and then the empty folder, nothing else.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import threading
from pathlib import Path

import attrs

from .._errors import CheckpointError
from . import _files, _locks

logger = logging.getLogger("idist.checkpoint")

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}
#: rename failures that mean another save published at the path first
_TAKEN = {errno.ENOTEMPTY, errno.EEXIST}
_NONCE = re.compile(r"[0-9a-f]{32}")
_KINDS = ("tmp", "old", "lock")
#: publishing gives up after this many rounds of other saves replacing the path under it
_TRIES = 16


def sibling(path: Path, kind: str, nonce: str) -> Path:
    """``.NAME.idist-KIND-NONCE`` beside ``path`` (kind: tmp, old or lock)."""
    return path.with_name(f".{path.name}.idist-{kind}-{nonce}")


@attrs.define
class Staging:
    """One save's staging folder, held by rank 0 (``lock`` is the open, locked lock file)."""

    path: Path
    nonce: str
    folder: Path
    lock: int | None = None
    #: published: what is left to do (removals, the lock) belongs to the removal thread
    published: bool = False


def stage(path: Path, nonce: str) -> Staging:
    """Rank 0: take the lock, make the staging folder and write the probe in it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Staging(path, nonce, sibling(path, "tmp", nonce), _locks.locked(sibling(path, "lock", nonce)))
    staging.folder.mkdir()
    (staging.folder / _files.PROBE).write_bytes(nonce.encode())  # other ranks read it through the filesystem
    return staging


def staged_folder(path: Path, nonce: str) -> Path:
    return sibling(path, "tmp", nonce)


def _release(staging: Staging) -> None:
    if staging.lock is not None:
        sibling(staging.path, "lock", staging.nonce).unlink(missing_ok=True)
        os.close(staging.lock)
        staging.lock = None


def discard(staging: Staging) -> None:
    """A failed save: remove its staging folder (a checkpoint's files only) and its lock."""
    try:
        remove_checkpoint(staging.folder)
    except OSError:
        pass  # a leftover the next save removes
    _release(staging)


def remove_checkpoint(folder: Path) -> bool:
    """Remove a checkpoint's files from ``folder``, then the folder; anything else stays, and the folder with it.

    True when the folder is gone. A symbolic link or a file is never touched.
    """
    if folder.is_symlink():
        return False
    try:
        entries = os.listdir(folder)
    except FileNotFoundError:
        return True
    except NotADirectoryError:
        return False
    for name in entries:
        if _files.is_checkpoint_file(name):
            try:
                os.unlink(folder / name)
            except FileNotFoundError:
                pass  # another save removed it first
            except OSError:
                pass  # not a file: it stays, and the folder with it
    try:
        os.rmdir(folder)
    except FileNotFoundError:
        return True
    except OSError:
        logger.warning("left %s in place: it holds entries that are not a checkpoint's files", folder)
        return False
    return True


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically; False where the system or filesystem cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _NO_EXCHANGE:
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_in(tmp: Path, path: Path, old: Path) -> list[Path]:
    """Make ``tmp`` the folder at ``path``; the folders that now hold what it replaced.

    Other saves may publish at the same path meanwhile: each round retries from what is
    there now, so the last publish wins and each checkpoint stays one save's whole folder.
    """
    for _ in range(_TRIES):
        if not os.path.lexists(path):
            try:
                os.rename(tmp, path)
                return []
            except OSError as exc:
                if exc.errno not in _TAKEN:
                    raise
                continue  # another save published first: replace its checkpoint
        try:
            if _exchange(tmp, path):
                return [tmp]
        except FileNotFoundError:
            continue
        try:
            os.rename(path, old)
        except FileNotFoundError:
            continue  # another save moved it aside first
        try:
            os.rename(tmp, path)
        except OSError as exc:
            if exc.errno not in _TAKEN:
                raise
            return [tmp, old]  # another save published after ours was ready: its checkpoint is the later one
        return [old]
    raise CheckpointError(f"could not publish {path}: other saves replaced it {_TRIES} times in a row")


def publish(staging: Staging) -> None:
    """Make the staged checkpoint ``staging.path`` in one rename; what it replaced, and crashed
    saves' leftovers, are removed in the background (``wait_removals``)."""
    (staging.folder / _files.PROBE).unlink(missing_ok=True)
    _files.fsync_dir(staging.folder)
    replaced = _swap_in(staging.folder, staging.path, sibling(staging.path, "old", staging.nonce))
    staging.published = True
    removal = threading.Thread(target=_clean_up, args=(staging, replaced), name="idist-checkpoint-removal")
    removal.start()  # before another thread's wait_removals can see it
    with _removals_lock:
        _removing.append(removal)
    _files.fsync_dir(staging.path.parent)


def _clean_up(staging: Staging, replaced: list[Path]) -> None:
    try:
        for folder in replaced:
            remove_checkpoint(folder)
        sweep(staging.path, staging.nonce)
    except OSError:
        pass  # the next save removes what is left
    finally:
        _release(staging)


def sweep(path: Path, mine: str) -> None:
    """Remove crashed saves' leftovers beside ``path``: folders whose save's lock nobody holds.

    A folder set aside (``old``) may be the only copy of the previous checkpoint: it goes
    only while a checkpoint is published at ``path``.
    """
    prefix = f".{path.name}.idist-"
    found: dict[str, set[str]] = {}
    for name in os.listdir(path.parent):
        kind, _, nonce = name[len(prefix) :].partition("-")
        if kind == "lock" and nonce.endswith(_locks.HIDDEN):  # a save that never locked it, or one locking it now
            nonce, kind = nonce.removesuffix(_locks.HIDDEN), "hidden"
        if name.startswith(prefix) and kind in (*_KINDS, "hidden") and _NONCE.fullmatch(nonce) and nonce != mine:
            found.setdefault(nonce, set()).add(kind)
    for nonce, kinds in found.items():
        lock_path = sibling(path, "lock", nonce)
        if "hidden" in kinds:
            _locks.remove_unheld(lock_path)
        lock = _locks.take(lock_path) if "lock" in kinds else None
        if lock == -1:
            continue  # that save is running, or the filesystem cannot say
        try:
            remove_checkpoint(sibling(path, "tmp", nonce))
            if path.is_dir() and not path.is_symlink():
                remove_checkpoint(sibling(path, "old", nonce))
            lock_path.unlink(missing_ok=True)  # what stays holds someone's files, or is the only copy
        finally:
            if lock is not None:
                os.close(lock)


#: removals of replaced checkpoints still running (threads the interpreter joins at exit)
_removing: list[threading.Thread] = []
#: simulated ranks (threads) save at once: one of them waits for the removals, the others for it
_removals_lock = threading.Lock()


def wait_removals() -> None:
    """Wait until every checkpoint replaced by a save of this process is gone."""
    with _removals_lock:
        for removal in _removing:
            removal.join()
        _removing.clear()
