"""Stall marks: the collective each rank is in, where its launcher can read it after the rank died.

gloo ends a rank by SIGABRT when a peer sends more bytes than its tensor holds (an unchecked
all_reduce of float32 against float64), and a dead process says nothing. ``idist run`` and
``idist.spawn`` share a small anonymous memory file with their ranks (``IDIST_STALL_MARKS`` names
its descriptor and the rank's slot); at the start of every backend call a rank writes its call
counter, its rank, the call and the group into its slot (no system call), negates the counter
when the call returns, and the launcher names the collective in its report only while the
counter says it is in flight. A failing rank reads its node's slots too: a node-mate in flight
at the failed call reached it, however late it is to say so (``Marks.in_call``). Nothing is on
disk: the memory goes with the last process that maps it, a killed launcher too.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable, Collection, Mapping, Sequence
from multiprocessing import reduction
from typing import Any

MARKS_VAR = "IDIST_STALL_MARKS"
#: the memory file's name, checked by a rank before it writes (a descriptor number it inherited
#: in the variable may name another file in a process the rank started)
_NAME = "idist-stall-marks"
#: the call counter of the group, the writer's rank, the call, the group
_RECORD = struct.Struct("<qq16s40s")
_SEQ = _RANK = struct.Struct("<q")


class Board:
    """The launcher's side: one slot per local rank, in memory it shares with the ranks."""

    def __init__(self, slots: int) -> None:
        self.fd = os.memfd_create(_NAME)
        os.ftruncate(self.fd, slots * _RECORD.size)
        self._map = mmap.mmap(self.fd, slots * _RECORD.size)

    def variable(self, slot: int) -> str:
        """``IDIST_STALL_MARKS`` for the rank in ``slot`` (start it with ``pass_fds=(board.fd,)``)."""
        return self.handed(slot).variable()

    def read(self, slot: int) -> str | None:
        """The collective the rank in ``slot`` is in ("all_reduce #17 on group world"), or None when
        it is in none (its last one returned, or it never called one)."""
        seq, _, call, group = _RECORD.unpack_from(self._map, slot * _RECORD.size)
        if seq <= 0:
            return None
        name, where = (field.rstrip(b"\0").decode("ascii", "replace") for field in (call, group))
        return f"{name} #{seq} on group {where}"

    def handed(self, slot: int) -> Handed:
        """The rank in ``slot``'s share, for a rank that multiprocessing starts."""
        return Handed(self.fd, slot)

    def close(self) -> None:
        self._map.close()
        os.close(self.fd)


class Handed:
    """A rank's slot of a board, in the arguments of a process that multiprocessing starts: pickled
    while it starts one (spawn, forkserver), the descriptor goes along (``reduction.DupFd``); a
    forked child inherits it. The launcher may close its own once the process started."""

    def __init__(self, fd: int, slot: int) -> None:
        self.fd, self.slot = fd, slot

    def variable(self) -> str:
        """``IDIST_STALL_MARKS`` naming this slot (``from_env`` reads it back)."""
        return f"{self.fd}:{self.slot}"

    def __reduce__(self) -> tuple[Callable[[Any, int], Handed], tuple[Any, int]]:
        return _rebuilt, (reduction.DupFd(self.fd), self.slot)


def _rebuilt(dup: Any, slot: int) -> Handed:
    return Handed(dup.detach(), slot)


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
        #: the global rank written with each call (-1 until ``claim``)
        self.rank = -1

    def claim(self, rank: int) -> None:
        """Sign this slot with the writer's global rank (once, when its context is made)."""
        self.rank = rank
        _RANK.pack_into(self._map, self._offset + _SEQ.size, rank)

    def write(self, seq: int, call: str | None, key: str = "world", ranks: Sequence[int] = ()) -> None:
        """The rank enters call number ``seq`` (> 0), ``call`` on the group ``key`` of ``ranks``, or,
        with ``call=None``, the call last written returned: it is no longer in flight."""
        if call is None:
            _SEQ.pack_into(self._map, self._offset, -self._seq)
            return
        _RECORD.pack_into(self._map, self._offset, seq, self.rank, call.encode(), _group(key, ranks))
        self._seq = seq

    def in_call(self, seqs: Collection[int], key: str, ranks: Sequence[int]) -> set[int]:
        """The ranks on this node (this one included) in flight at one of the calls ``seqs`` of
        the group ``key``: they reached it (a failed call stays in flight in its slot)."""
        group = _group(key, ranks)
        found: set[int] = set()
        for offset in range(0, len(self._map) - _RECORD.size + 1, _RECORD.size):
            seq, rank, _, where = _RECORD.unpack_from(self._map, offset)
            if seq in seqs and rank >= 0 and where.rstrip(b"\0") == group:
                found.add(rank)
        return found


def _group(key: str, ranks: Sequence[int]) -> bytes:
    """How a slot names a group (as much as fits)."""
    return (b"world" if key == "world" else str(list(ranks)).encode())[:40]


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


def received(handed: Handed | None) -> None:
    """In a rank that multiprocessing started: its own slot (``None``: none), never one its
    parent's variable or (forked) its parent's marks named."""
    _mine.clear()
    if handed is None:
        os.environ.pop(MARKS_VAR, None)
    else:
        os.environ[MARKS_VAR] = handed.variable()


def claimed(env: Mapping[str, str], rank: int) -> Marks | None:
    """``from_env``'s marks, signed with ``rank`` (see ``Marks.claim``)."""
    marks = from_env(env)
    if marks is not None:
        marks.claim(rank)
    return marks
