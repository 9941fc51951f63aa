"""A checkpoint's folder on disk: its staging sibling, the probe, durable writes, the publishing rename.

A save writes into ``.NAME.idist-tmp`` beside ``NAME`` and publishes it with one rename, so
a reader sees the old checkpoint or the new one, never a mix. Where the filesystem can
exchange two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``), an existing
checkpoint is swapped out in one step; elsewhere it is moved aside first (``.NAME.idist-old``)
and a load that finds only that tells the user how to put it back.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from .._errors import CheckpointError, CheckpointNotFoundError, CheckpointPathError

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata

#: the DCP metadata file torch writes; a folder without it is no checkpoint
DCP_METADATA = ".metadata"
#: idist's description of the checkpoint (entries and their kinds, who saved it)
MANIFEST = "idist.json"
#: the plain values and the state of stateful objects, pickled by rank 0
VALUES = "idist-values.pt"
PROBE = ".idist-probe"

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}


def staging(path: Path) -> Path:
    """Where a save of ``path`` writes before it is published."""
    return path.with_name(f".{path.name}.idist-tmp")


def set_aside(path: Path) -> Path:
    """Where the previous checkpoint waits while a save without atomic exchange publishes."""
    return path.with_name(f".{path.name}.idist-old")


def remove(path: Path) -> None:
    """Remove a file or folder tree; nothing there is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def fresh_staging(path: Path, nonce: str) -> Path:
    """An empty staging folder (a stale one from a failed save is removed) with the probe in it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = staging(path)
    remove(tmp)
    if path.exists():  # else a previous checkpoint set aside by an interrupted save may be all there is
        remove(set_aside(path))
    tmp.mkdir()
    (tmp / PROBE).write_bytes(nonce.encode())  # other ranks read it through the filesystem: no fsync needed
    return tmp


def check_probe(tmp: Path, nonce: str) -> None:
    """``CheckpointPathError`` unless this rank sees the probe that rank 0 just wrote."""
    try:
        seen = (tmp / PROBE).read_bytes().decode(errors="replace")
    except OSError as exc:
        raise CheckpointPathError(
            f"cannot see {tmp}, which rank 0 created ({type(exc).__name__}: {exc}); every rank must see the "
            "same folder: save to a filesystem shared by all nodes"
        ) from exc
    if seen != nonce:
        raise CheckpointPathError(
            f"{tmp} here is not the folder rank 0 created (another copy of the path): every rank must see "
            "the same folder: save to a filesystem shared by all nodes"
        )


def write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` and flush it to the disk before returning."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def publish(tmp: Path, path: Path) -> None:
    """Make the staged checkpoint ``path`` in one rename; the one it replaces is removed in the
    background (``wait_removals``), so that unlinking its files costs the caller nothing."""
    (tmp / PROBE).unlink(missing_ok=True)
    fsync_dir(tmp)
    if not path.exists() and not path.is_symlink():
        os.rename(tmp, path)
        old = None
    elif _exchange(tmp, path):
        old = tmp  # now the previous checkpoint
    else:
        old = set_aside(path)
        os.rename(path, old)
        os.rename(tmp, path)
    fsync_dir(path.parent)
    if old is not None:
        removal = threading.Thread(target=_remove_quietly, args=(old,), name="idist-checkpoint-removal")
        with _removals_lock:
            _removing.append(removal)
        removal.start()


#: removals of replaced checkpoints still running (threads the interpreter joins at exit)
_removing: list[threading.Thread] = []
#: simulated ranks (threads) save at once: one of them waits for the removals, the others for it
_removals_lock = threading.Lock()


def _remove_quietly(path: Path) -> None:
    try:
        remove(path)
    except OSError:
        pass  # the next save of that path removes what is left


def wait_removals() -> None:
    """Wait until every replaced checkpoint is gone (a save reuses their names)."""
    with _removals_lock:
        for removal in _removing:
            removal.join()
        _removing.clear()


def check_complete(path: Path, metadata: Metadata) -> None:
    """``CheckpointError`` unless every data file the metadata names holds the bytes it names there."""
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, size in sorted(needed.items()):
        try:
            held = (path / name).stat().st_size
        except OSError as exc:
            raise CheckpointError(f"the checkpoint at {path} lacks {name} ({type(exc).__name__}: {exc})") from exc
        if held < size:
            raise CheckpointError(
                f"the checkpoint at {path} is incomplete: {name} holds {held} bytes, its metadata names {size}"
            )


def check_readable(path: Path) -> None:
    """``CheckpointNotFoundError`` unless ``path`` is a checkpoint folder this rank can read."""
    if (path / DCP_METADATA).is_file():
        return
    if not path.exists():
        aside = set_aside(path)
        hint = (
            f"; a save was interrupted while publishing and left the previous checkpoint at {aside}: "
            f"rename it to {path.name}"
            if aside.exists()
            else ""
        )
        raise CheckpointNotFoundError(f"no checkpoint at {path}{hint}")
    raise CheckpointNotFoundError(
        f"{path} is not a checkpoint folder (no {DCP_METADATA} in it); pass a folder written by save_checkpoint "
        "or torch.distributed.checkpoint.save"
    )
