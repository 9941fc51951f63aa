"""Stall marks: what a rank writes at each backend call is what its launcher reads after it died,
through memory they share (nothing on disk), and a rank never writes to a descriptor that is not
its launcher's board."""

from __future__ import annotations

import os
import tempfile

import pytest

from idist import _marks


def test_a_ranks_mark_reaches_the_board() -> None:
    board = _marks.board(3)
    if board is None:
        pytest.skip("no anonymous memory files here (memfd_create is Linux's)")
    try:
        assert [board.read(s) for s in range(3)] == [None] * 3
        mine = _marks.Marks(*map(int, board.variable(2).split(":")))
        mine.write(17, "all_reduce")
        mine.write(18, "broadcast", "g1", (0, 2))
        assert [board.read(s) for s in range(3)] == [None, None, "broadcast #18 on group [0, 2]"]
    finally:
        board.close()


def test_a_descriptor_that_is_not_the_board_is_refused() -> None:
    with tempfile.TemporaryFile() as f:
        f.write(b"\0" * 4096)
        f.flush()
        with pytest.raises(OSError, match="not the launcher's stall marks"):
            _marks.Marks(f.fileno(), 0)
        f.seek(0)
        assert f.read() == b"\0" * 4096  # untouched


def test_no_variable_means_no_marks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_marks, "_mine", [])
    assert _marks.from_env({}) is None
    monkeypatch.setattr(_marks, "_mine", [])
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        assert _marks.from_env({_marks.MARKS_VAR: f"{fd}:0"}) is None
    finally:
        os.close(fd)


def test_a_call_that_returned_is_no_longer_in_flight() -> None:
    board = _marks.board(1)
    if board is None:
        pytest.skip("no anonymous memory files here (memfd_create is Linux's)")
    try:
        mine = _marks.Marks(*map(int, board.variable(0).split(":")))
        mine.write(3, "all_reduce")
        assert board.read(0) == "all_reduce #3 on group world"
        mine.write(3, None)
        assert board.read(0) is None
        mine.write(4, "barrier")
        assert board.read(0) == "barrier #4 on group world"
    finally:
        board.close()
