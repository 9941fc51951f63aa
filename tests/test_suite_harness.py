"""The suite's own harness under pytest-xdist: ports from the worker's range, rank processes
that see the caller's environment and folder as they are at the call (they fork from a
forkserver that started earlier), and the timed tests kept together on one worker."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

from multiproc import free_port, run_ranks


def test_free_ports_come_from_this_workers_range_below_the_ephemeral_ones() -> None:
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert all(20000 + 1000 * worker <= p < 21000 + 1000 * worker < low for p in ports), ports
    assert len(set(ports)) == 50  # handed out in turn, not the same one again
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # free when handed out


def _seen(rank: int) -> dict[str, Any]:
    return {"var": os.environ.get("IDIST_HARNESS_PROBE"), "cwd": os.getcwd(), "rank": os.environ["RANK"]}


def test_ranks_see_the_callers_environment_and_folder_at_the_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    run_ranks(_seen, 1)  # the forkserver is running before the caller changes anything
    monkeypatch.setenv("IDIST_HARNESS_PROBE", "set-after")
    monkeypatch.chdir(tmp_path)
    out = run_ranks(_seen, 2, timeout=60)
    assert out == [{"var": "set-after", "cwd": str(tmp_path), "rank": str(r)} for r in range(2)]


def test_the_timed_tests_share_one_xdist_group(request: pytest.FixtureRequest) -> None:
    items = request.session.items
    timed = [i for i in items if i.get_closest_marker("timed") is not None]
    if not timed:
        pytest.skip("no timed test is collected in this run")
    groups = {m.args[0] for i in timed for m in i.iter_markers("xdist_group")}
    assert groups == {"timed"}, groups
    if getattr(request.config.option, "loadgroup", False):  # a worker of --dist loadgroup
        # what loadgroup schedules by: the group in the node id, put there by pytest-xdist's own
        # collection hook, which must see the marks (every group was split when it ran first)
        grouped = [i for i in items if i.get_closest_marker("xdist_group") is not None]
        assert all(i.nodeid.endswith("@timed") for i in timed), [i.nodeid for i in timed][:3]
        assert all("@" in i.nodeid for i in grouped), [i.nodeid for i in grouped if "@" not in i.nodeid][:3]
