"""Stall marks: the collective each rank is in, where its launcher can read it after the rank died.

gloo ends a rank by SIGABRT when a peer sends more bytes than its tensor holds (an unchecked
all_reduce of float32 against float64), and a dead process says nothing. ``idist run`` points
``IDIST_STALL_MARKS`` at a private folder; each rank then writes, at the start of every backend
call, its call counter, the call and the group into a 64-byte file mapped in memory there (no
system call per collective), and the launcher names that collective in its report.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Mapping

MARKS_VAR = "IDIST_STALL_MARKS"
#: the call counter of the group, the call, the group's key
_RECORD = struct.Struct("<q16s40s")


def _path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rank{rank}")


class Marks:
    """This rank's stall mark: one record, overwritten by every backend call."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, _RECORD.size)
            self._map = mmap.mmap(fd, _RECORD.size)
        finally:
            os.close(fd)

    def write(self, seq: int, call: bytes, group: bytes) -> None:
        _RECORD.pack_into(self._map, 0, seq, call, group)


def from_env(rank: int, env: Mapping[str, str]) -> Marks | None:
    """This rank's marks when its launcher asked for them, else None (or when they cannot be made)."""
    folder = env.get(MARKS_VAR)
    if not folder:
        return None
    try:
        return Marks(_path(folder, rank))
    except OSError:
        return None  # a report the launcher cannot give is no reason to fail the rank


def read(folder: str, rank: int) -> str | None:
    """The last collective ``rank`` marked in ``folder`` ("all_reduce #17 on group world"), or None."""
    try:
        with open(_path(folder, rank), "rb") as f:
            data = f.read(_RECORD.size)
    except OSError:
        return None
    if len(data) != _RECORD.size:
        return None
    seq, call, group = _RECORD.unpack(data)
    if seq <= 0:
        return None
    name, where = (field.rstrip(b"\0").decode("ascii", "replace") for field in (call, group))
    return f"{name} #{seq} on group {where}"
