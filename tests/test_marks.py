"""Stall marks: what a rank writes at each backend call is what its launcher reads after it died,
through memory they share (nothing on disk), and a rank never writes to a descriptor that is not
its launcher's board."""

from __future__ import annotations

import datetime
import os
import tempfile
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from torch._C._distributed_c10d import HashStore, Store

from idist import _marks
from idist._backends.native._guard import Guard
from idist._backends.native._verdict import Fault, Verdict


@pytest.fixture
def new_board() -> Iterator[Callable[[int], _marks.Board]]:
    """Makes launchers' boards (skipped where memfd_create does not exist), closed after the test."""
    made: list[_marks.Board] = []

    def make(slots: int) -> _marks.Board:
        board = _marks.board(slots)
        if board is None:
            pytest.skip("no anonymous memory files here (memfd_create is Linux's)")
        made.append(board)
        return board

    yield make
    for board in made:
        board.close()


def _slot(board: _marks.Board, slot: int) -> _marks.Marks:
    """A rank's side of ``board``'s ``slot``, as the launcher's variable names it."""
    return _marks.Marks(*map(int, board.variable(slot).split(":")))


def test_a_ranks_mark_reaches_the_board(new_board: Callable[[int], _marks.Board]) -> None:
    board = new_board(3)
    assert [board.read(s) for s in range(3)] == [None] * 3
    mine = _slot(board, 2)
    mine.write(17, "all_reduce")
    mine.write(18, "broadcast", "g1", (0, 2))
    assert [board.read(s) for s in range(3)] == [None, None, "broadcast #18 on group [0, 2]"]


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


def test_a_call_that_returned_is_no_longer_in_flight(new_board: Callable[[int], _marks.Board]) -> None:
    board = new_board(1)
    mine = _slot(board, 0)
    mine.write(3, "all_reduce")
    assert board.read(0) == "all_reduce #3 on group world"
    mine.write(3, None)
    assert board.read(0) is None
    mine.write(4, "barrier")
    assert board.read(0) == "barrier #4 on group world"


# ------------------------------------------- a failure's diagnosis reads the node's marks
def _rank(store: Store, rank: int, marks: _marks.Marks | None = None) -> tuple[Guard, Any]:
    """Rank ``rank`` of a world of 4 whose all_reduce #5 failed: its guard (a short grace) and comm."""
    comm = SimpleNamespace(key="world", ranks=(0, 1, 2, 3), group_rank=rank, lockstep=SimpleNamespace(seq=5))
    return Guard(store, datetime.timedelta(seconds=30), stall_grace=0.2, marks=marks), comm


def _diagnose(store: Store, rank: int, marks: _marks.Marks | None = None) -> Callable[[], tuple[int, ...]]:
    """Rank ``rank`` counts in now; what it names once it waited (the call returned)."""
    guard, comm = _rank(store, rank, marks)
    tallies = guard.count_in(comm)
    return lambda: guard.report(comm, Verdict("all_reduce", (0, 1, 2, 3), Fault.LOST), tallies).missing


def test_a_node_mate_late_to_count_in_is_not_named_missing(new_board: Callable[[int], _marks.Board]) -> None:
    """Rank 3 is gone; rank 1, on rank 0's node, is in the failed all_reduce but takes longer than
    the grace to wake (a loaded machine). Rank 0 names rank 3 alone: rank 1's stall mark shows it in
    the call. Rank 2, on another node, hears the same; rank 1, once awake, too."""
    board = new_board(2)
    marks = [_slot(board, s) for s in range(2)]
    for rank, mine in enumerate(marks):
        mine.claim(rank)
        mine.write(5, "all_reduce")
    store = HashStore()
    rank2 = _diagnose(store, 2)
    assert _diagnose(store, 0, marks[0])() == (3,)
    assert rank2() == (3,)
    assert _diagnose(store, 1, marks[1])() == (3,)


def test_a_rank_told_it_is_missing_after_it_counted_in_names_only_the_others() -> None:
    """No marks (spawn): rank 0 names rank 1, which counted in after the grace. Rank 1 then reads
    that answer, and names rank 3 alone, never itself."""
    store = HashStore()
    rank2 = _diagnose(store, 2)
    assert _diagnose(store, 0)() == (1, 3)
    assert rank2() == (1, 3)
    assert _diagnose(store, 1)() == (3,)


def test_a_node_mate_in_another_call_is_not_taken_for_one_in_this_call(
    new_board: Callable[[int], _marks.Board],
) -> None:
    board = new_board(2)
    mine = _slot(board, 1)
    mine.claim(1)
    assert mine.in_call((5,), "world", (0, 1)) == set()  # a slot never written
    mine.write(5, "all_reduce", "g1", (0, 1))
    assert mine.in_call((5,), "world", (0, 1)) == set()
    assert mine.in_call((5,), "g1", (0, 1)) == {1}
    mine.write(5, None)  # it returned
    assert mine.in_call((5,), "g1", (0, 1)) == set()
    mine.write(9, "barrier")
    assert mine.in_call((4, 5, 6), "world", (0, 1)) == set()
