"""Stall marks: the collective each rank is in, where its launcher can read it after the rank died.

gloo ends a rank by SIGABRT when a peer sends more bytes than its tensor holds (an unchecked
all_reduce of float32 against float64), and a dead process says nothing. ``idist run`` shares a
small anonymous memory file with its ranks (``IDIST_STALL_MARKS`` names its descriptor and the
rank's slot); at the start of every backend call a rank writes its call counter, the call and
the group into its slot (no system call), negates the counter when the call returns, and the
launcher names the collective in its report only while the counter says it is in flight.
Nothing is on disk: the memory goes with the last process that maps it, a killed launcher too.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Mapping, Sequence

MARKS_VAR = "IDIST_STALL_MARKS"
#: the memory file's name, checked by a rank before it writes (a descriptor number it inherited
#: in the variable may name another file in a process the rank started)
_NAME = "idist-stall-marks"
#: the call counter of the group, the call, the group
_RECORD = struct.Struct("<q16s40s")
_SEQ = struct.Struct("<q")


class Board:
    """The launcher's side: one slot per local rank, in memory it shares with the ranks."""

    def __init__(self, slots: int) -> None:
        self.fd = os.memfd_create(_NAME)
        os.ftruncate(self.fd, slots * _RECORD.size)
        self._map = mmap.mmap(self.fd, slots * _RECORD.size)

    def variable(self, slot: int) -> str:
        """``IDIST_STALL_MARKS`` for the rank in ``slot`` (start it with ``pass_fds=(board.fd,)``)."""
        return f"{self.fd}:{slot}"

    def read(self, slot: int) -> str | None:
        """The collective the rank in ``slot`` is in ("all_reduce #17 on group world"), or None when
        it is in none (its last one returned, or it never called one)."""
        seq, call, group = _RECORD.unpack_from(self._map, slot * _RECORD.size)
        if seq <= 0:
            return None
        name, where = (field.rstrip(b"\0").decode("ascii", "replace") for field in (call, group))
        return f"{name} #{seq} on group {where}"

    def close(self) -> None:
        self._map.close()
        os.close(self.fd)


def board(slots: int) -> Board | None:
    """A board for ``slots`` ranks, or None where anonymous memory files do not exist (not Linux)."""
    try:
        return Board(slots)
    except (AttributeError, OSError):
        return None


class Marks:
    """A rank's side: its slot of the board, overwritten by every backend call."""

    def __init__(self, fd: int, slot: int) -> None:
        if not os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{_NAME}"):
            raise OSError(f"descriptor {fd} is not the launcher's stall marks")
        self._map = mmap.mmap(fd, os.fstat(fd).st_size)
        self._offset = slot * _RECORD.size
        if self._offset + _RECORD.size > len(self._map):
            raise OSError(f"no stall-mark slot {slot}")
        self._seq = 0

    def write(self, seq: int, call: str | None, key: str = "world", ranks: Sequence[int] = ()) -> None:
        """The rank enters call number ``seq`` (> 0), ``call`` on the group ``key`` of ``ranks``, or,
        with ``call=None``, the call last written returned: it is no longer in flight."""
        if call is None:
            _SEQ.pack_into(self._map, self._offset, -self._seq)
            return
        group = "world" if key == "world" else str(list(ranks))
        _RECORD.pack_into(self._map, self._offset, seq, call.encode(), group.encode()[:40])
        self._seq = seq


_mine: list[Marks | None] = []


def from_env(env: Mapping[str, str]) -> Marks | None:
    """This process's marks when its launcher shares a board (once per process), else None."""
    if not _mine:
        fd, _, slot = env.get(MARKS_VAR, "").partition(":")
        try:
            _mine.append(Marks(int(fd), int(slot)))
        except (ValueError, OSError):
            _mine.append(None)  # a report the launcher cannot give is no reason to fail the rank
    return _mine[0]
