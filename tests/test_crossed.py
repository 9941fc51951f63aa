"""The crossed-call watch on a real store: different calls conclude, the same call never does."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import torch.distributed as dist

from idist._backends.native._crossed import POST_AFTER, Crossing


def _watches(lines: list[str], ranks: tuple[int, ...] = (0, 1)) -> list[Crossing]:
    store = dist.HashStore()
    return [Crossing(store, "crossed/world/7.0", 7, ranks, r, line) for r, line in enumerate(lines)]


def _post_all(watches: list[Crossing]) -> list[str | None]:
    """Every rank's looks past POST_AFTER, at once, until it concludes (a rank that concluded
    waits for the others to), or for 8 looks."""
    out: list[str | None] = [None] * len(watches)

    def look(i: int) -> None:
        for looks in range(4, 12):
            if (said := watches[i].look(POST_AFTER + looks - 4, looks)) is not None:
                out[i] = said
                return
            time.sleep(0.05)

    threads = [threading.Thread(target=look, args=(i,)) for i in range(len(watches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_ranks_waiting_in_the_same_call_conclude_nothing() -> None:
    watches = _watches(["a tensor all_reduce of 16 bytes"] * 3, (0, 1, 2))
    assert _post_all(watches) == [None, None, None]
    assert [w.look(POST_AFTER + 9, 13) for w in watches] == [None, None, None]  # nor on a later look


def test_a_short_wait_posts_nothing() -> None:
    (watch, _) = _watches(["x", "y"])
    assert watch.look(POST_AFTER / 2, 0) is None and not watch.posted


def test_different_calls_give_every_rank_the_same_report() -> None:
    watches = _watches(["a tensor all_reduce of 16 bytes", "an all_reduce of a Python number"])
    first = watches[0].look(POST_AFTER, 4)  # alone so far: nothing yet
    assert first is None and watches[0].posted
    said = _post_all(watches)  # the other posts; the first reads the counter again
    assert said[0] == said[1] and said[0] is not None
    assert "rank 0: a tensor all_reduce of 16 bytes\n  rank 1: an all_reduce of a Python number" in said[0]


def test_a_group_names_its_global_ranks() -> None:
    store = dist.HashStore()
    said = _post_all([Crossing(store, "p", 1, (3, 5), r, line) for r, line in enumerate(["a", "b"])])
    assert said[0] == said[1] and said[0] is not None
    assert "rank 3: a\n  rank 5: b" in said[0]


def test_a_store_request_still_running_at_exit_is_waited_for(tmp_path: Path) -> None:
    # a watch's request is not waited for by the wait; the interpreter must not end inside it
    # (a daemon thread in torch's C++ at exit aborts the process), whether or not it was bounded
    marker = tmp_path / "done"
    code = (
        "import time\n"
        "from idist._backends.native._verdict import Request\n"
        f"Request(lambda: time.sleep(0.5) or open({str(marker)!r}, 'w').close())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert marker.is_file()
