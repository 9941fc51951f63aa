"""Horovod process sets as ``group=``: found by the set object, never by an id Horovod reuses."""

from __future__ import annotations

from hvdrun import hvdrun


def test_a_removed_process_sets_id_never_brings_back_its_comm() -> None:
    rounds = 4
    results = hvdrun("cases_groups:process_sets_come_and_go", 2, rounds, timeout=300)
    ids = [r[0] for r in results[0]["rounds"]]
    assert len(set(ids)) < rounds, ids  # Horovod reused an id: the case this test is about
    for rank, out in enumerate(results):
        assert out["world"] == 3
        # a set of one: its member and the rank outside both get their own input back
        assert out["rounds"] == [(ids[i], [rank + 10.0 * i], [rank], [rank + 0.5]) for i in range(rounds)]
