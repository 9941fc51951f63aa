"""``barrier()``: no rank leaves before every rank arrived; ``sync()`` too; also within groups.

Arrival and departure are read from ``time.monotonic()``, one clock for all threads and,
on Linux (CLOCK_MONOTONIC), for all processes of the machine.
"""

from __future__ import annotations

import time
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from idist import DistContext
from idist.testing import Runner


def arrive_and_leave(ctx: DistContext, delays: list[float], how: str, group: list[int] | None) -> tuple[float, float]:
    time.sleep(delays[ctx.rank])
    arrived = time.monotonic()
    if how == "barrier":
        ctx.barrier(group=group)
    else:
        ctx.sync(group=group)
    return arrived, time.monotonic()


@given(data=st.data(), how=st.sampled_from(["barrier", "sync"]))
def test_no_rank_leaves_before_all_arrived(runner: Runner, data: st.DataObject, how: str) -> None:
    n = runner.world_size
    delays = data.draw(st.lists(st.sampled_from([0.0, 0.0, 0.002, 0.01, 0.03]), min_size=n, max_size=n))
    group: Any = data.draw(
        st.one_of(st.none(), st.lists(st.integers(0, n - 1), min_size=1).map(lambda g: sorted(set(g))))
    )
    times = runner.run(arrive_and_leave, delays, how, group)
    members = range(n) if group is None else group
    last_arrival = max(times[r][0] for r in members)
    for r in members:
        assert times[r][1] >= last_arrival, (r, times, delays)
