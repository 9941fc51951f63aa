"""The node board: a small shared-memory file in which a node's ranks post their liveness.

Each local rank owns one slot and writes only there: a tick its watcher advances every
interval, and how its store calls fare (the last that answered, the one in flight, failures
in a row, the version of the lost-ranks record it knows). Every local rank reads every slot,
so a node's ranks watch each other without a store request; the node's speaker copies the
lost-ranks record there (seconds of silence per rank). The file (``/dev/shm``, else the
temporary folder) is unlinked once every local rank has opened it, and at the latest when a
rank closes; files a crash left behind are removed by the next board opened on that machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import tempfile
from array import array
from collections.abc import Mapping
from pathlib import Path

import attrs

_MAGIC = 0x1D157B0A
_PREFIX = "idist-live-"
#: header: magic, local ranks, the store's node (-1: not known yet), ranks that opened the file
_HEAD = struct.Struct("<qqqq")
#: a slot: pid, tick, last store call that answered, store call in flight since (0: none),
#: store calls failed in a row, version of the lost-ranks record known
_SLOT = struct.Struct("<qqddqq")
TICK, OK, PENDING, FAILS, VERSION = 1, 2, 3, 4, 5
_SWEPT: list[Path] = []


@attrs.frozen
class Slot:
    pid: int
    tick: int
    ok: float
    pending: float
    fails: int
    version: int


def _folder() -> Path:
    shm = Path("/dev/shm")  # noqa: S108 - the files are named by a random token and opened 0600
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's process counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(folder: Path) -> None:
    """Remove boards whose every opener is gone (a job that crashed before all its ranks opened)."""
    for path in folder.glob(f"{_PREFIX}*"):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a rank opening it holds the lock: skip it
            data = os.read(fd, 1 << 20)
            magic, nproc, _, _ = _HEAD.unpack_from(data)
            pids = [_SLOT.unpack_from(data, _HEAD.size + i * _SLOT.size)[0] for i in range(nproc)]
            if magic == _MAGIC and not any(p > 0 and pid_alive(p) for p in pids):
                path.unlink()
        except (OSError, struct.error):
            continue
        finally:
            os.close(fd)  # no map holds this descriptor: closing it unlocks


@attrs.define(eq=False)
class NodeBoard:
    """One node's board, as seen by local rank ``me`` of ``nproc``."""

    path: Path
    nproc: int
    me: int
    world: int
    _map: mmap.mmap

    @classmethod
    def open(cls, token: str, node: int, nproc: int, me: int, world: int) -> NodeBoard:
        """The board of job ``token``'s node ``node`` (created by whichever local rank comes first)."""
        folder = _folder()
        if not _SWEPT:  # once a process: leftovers come from crashes, not from this job
            _SWEPT.append(folder)
            sweep(folder)
        path = folder / f"{_PREFIX}{token}-n{node}"
        size = _HEAD.size + nproc * _SLOT.size + 4 * world
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            view = mmap.mmap(fd, size)
            magic, _, store_node, opened = _HEAD.unpack_from(view)
            if magic != _MAGIC:
                store_node, opened = -1, 0
            _HEAD.pack_into(view, 0, _MAGIC, nproc, store_node, opened + 1)
            _SLOT.pack_into(view, _HEAD.size + me * _SLOT.size, os.getpid(), 0, 0.0, 0.0, 0, 0)
            if opened + 1 >= nproc:  # every local rank holds it: nothing is left on disk, even after a crash
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)  # the map holds a duplicate of fd: closing fd would not unlock
            os.close(fd)
        return cls(path, nproc, me, world, view)

    def post(self, field: int, value: float) -> None:
        """Write one field of this rank's own slot (8 bytes, aligned: never torn on the platforms torch runs)."""
        fmt = "<d" if field in (OK, PENDING) else "<q"
        struct.pack_into(fmt, self._map, _HEAD.size + self.me * _SLOT.size + 8 * field, value)

    def slots(self) -> list[Slot]:
        data = self._map[: _HEAD.size + self.nproc * _SLOT.size]
        return [Slot(*_SLOT.unpack_from(data, _HEAD.size + i * _SLOT.size)) for i in range(self.nproc)]

    def post_lost(self, seconds: Mapping[int, float]) -> None:
        """Copy the lost-ranks record here (the speaker does): seconds of silence per lost rank."""
        values = array("f", bytes(4 * self.world))
        for rank, quiet in seconds.items():
            values[rank] = max(quiet, 0.05)
        start = _HEAD.size + self.nproc * _SLOT.size
        self._map[start : start + 4 * self.world] = values.tobytes()

    def lost(self) -> dict[int, float]:
        """The lost ranks the node's speaker copied here, and seconds of silence each."""
        start = _HEAD.size + self.nproc * _SLOT.size
        values = array("f", self._map[start : start + 4 * self.world])
        return {rank: float(quiet) for rank, quiet in enumerate(values) if quiet > 0}

    @property
    def store_node(self) -> int:
        """The node that serves the store, as the node's ranks found it (-1: not known)."""
        return int(struct.unpack_from("<q", self._map, 16)[0])

    @store_node.setter
    def store_node(self, node: int) -> None:
        struct.pack_into("<q", self._map, 16, node)

    def close(self, unmap: bool = True) -> None:
        """Unlink the file (if still there) and, when no thread may still post, unmap it."""
        with contextlib.suppress(OSError):
            self.path.unlink()
        if unmap:
            with contextlib.suppress(BufferError, ValueError):
                self._map.close()
