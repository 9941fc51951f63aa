"""Bad input and rank failures on 2 real Horovod ranks: typed errors everywhere, no hang."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hvdrun import RankFailed, hvdrun, run_raw


@pytest.fixture(scope="module")
def bad() -> list[dict[str, Any]]:
    return hvdrun("cases:bad_inputs", 2, timeout=300)


@pytest.mark.parametrize(
    ("key", "error", "says"),
    [
        ("unknown_op", "UnsupportedOpError", "valid ops"),
        ("adasum_int", "UnsupportedOpError", "floating-point"),
        ("adasum_float_value", "UnsupportedOpError", "Use SUM or AVERAGE"),
        ("adasum_group", "UnsupportedOpError", "all ranks only"),
        ("bad_src", "CollectiveInputError", "0..1"),
        ("shape_mismatch", "CollectiveInputError", "same shape and dtype"),
        ("dtype_mismatch", "CollectiveInputError", "same shape and dtype"),
        ("emulated_shape_mismatch", "CollectiveInputError", "same tensor shape and dtype"),
        ("gather_dtype_mismatch", "CollectiveInputError", "cast with .to(dtype)"),
        ("value_type_mismatch", "UnsupportedValueError", "the same type on every rank"),
        ("unpicklable", "UnsupportedValueError", "does not pickle"),
        ("overflow", "ReduceOverflowError", "int64"),
        ("bad_group", "CollectiveInputError", "within 0..1"),
    ],
)
def test_the_same_typed_error_on_every_rank(bad: list[dict[str, Any]], key: str, error: str, says: str) -> None:
    got = [r[key] for r in bad]
    assert [g[0] for g in got] == [error, error], got
    assert all(says in g[1] for g in got), got


def test_the_world_still_works_after_bad_input(bad: list[dict[str, Any]]) -> None:
    assert [r["still_works"] for r in bad] == [[2.0], [2.0]]


@pytest.mark.parametrize("bad_rank", [0, 1])
def test_a_failing_rank_is_reported_and_nothing_hangs(bad_rank: int) -> None:
    start = time.monotonic()
    outcome = run_raw("cases:fail_on_rank", 2, bad_rank, timeout=240)
    took = time.monotonic() - start
    assert outcome.returncode != 0
    assert outcome.done == {}
    # the failing rank's own traceback...
    assert f"deliberate failure on rank {bad_rank}" in outcome.errors[bad_rank]
    assert "ZeroDivisionError" in outcome.errors[bad_rank]
    # ...and its peer, blocked in a collective, got a typed error instead of hanging
    peer = 1 - bad_rank
    assert "idist._errors.PeerLostError" in outcome.errors[peer], outcome.errors[peer]
    assert "another rank raised or exited" in outcome.errors[peer]
    with pytest.raises(RankFailed, match=r"rank [01] failed"):
        _ = outcome.results
    # well inside Horovod's own 60 s collective timeout: nothing waited for a timeout
    assert took < 60, took
