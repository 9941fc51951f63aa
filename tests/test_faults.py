"""Never lie, never hang: one rank's error ends the collective on every rank within a second,
no call ever pairs with another, checked mode ships errors and names absent ranks, bad
launcher values are typed, and nothing outlives its launcher."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

import idist
from idist.testing import WorldTimeoutError, simulate
from launch_util import SCRIPTS, run_py
from multiproc import run_ranks

pytestmark = pytest.mark.timeout(180)

#: one rank (rank 1) calls with this, the other with a valid call of the same collective
ONE_RANK_BAD: dict[str, tuple[Callable[[idist.DistContext], object], Callable[[idist.DistContext], object]]] = {
    "bad src": (lambda c: c.broadcast(1.0, src=0), lambda c: c.broadcast(1.0, src=5)),
    "unknown op": (lambda c: c.all_reduce(torch.ones(2)), lambda c: c.all_reduce(torch.ones(2), "FOO")),  # type: ignore[call-overload]
    "AVERAGE of ints": (
        lambda c: c.all_reduce(torch.ones(2, dtype=torch.int64), "SUM"),
        lambda c: c.all_reduce(torch.ones(2, dtype=torch.int64), "AVERAGE"),
    ),
    "bad group": (lambda c: c.all_reduce(1, group=[0, 1]), lambda c: c.all_reduce(1, group=[0, 5])),
    "meta tensor": (lambda c: c.all_reduce(torch.ones(2)), lambda c: c.all_reduce(torch.ones(2, device="meta"))),
    "dtype gloo lacks": (
        lambda c: c.all_reduce(torch.ones(2, dtype=torch.int64)),
        lambda c: c.all_reduce(torch.ones(2, dtype=torch.uint16)),
    ),
}


def _one_rank_bad(ctx: idist.DistContext, case: str) -> dict[str, Any]:
    good, bad = ONE_RANK_BAD[case]
    out: dict[str, Any] = {}
    start = time.monotonic()
    try:
        (bad if ctx.rank == 1 else good)(ctx)
        out["first"] = ("ok", "")
    except idist.IdistError as exc:
        out["first"] = (type(exc).__name__, str(exc))
    out["took"] = time.monotonic() - start
    later = time.monotonic()
    try:
        out["later"] = ("ok", ctx.all_reduce(100))  # must never pair with the failed call
    except idist.IdistError as exc:
        out["later"] = (type(exc).__name__, str(exc))
    out["later_took"] = time.monotonic() - later
    return out


@pytest.mark.parametrize("case", ONE_RANK_BAD)
def test_one_rank_alone_with_bad_input_breaks_the_group_on_every_rank_within_a_second(case: str) -> None:
    peer, bad = simulate(2, _one_rank_bad, case, checked=False, timeout=30)
    assert bad["first"][0] in ("CollectiveInputError", "UnsupportedOpError", "UnsupportedValueError"), bad
    assert peer["first"][0] == "GroupBrokenError", peer
    assert "rank 1" in peer["first"][1] and bad["first"][1].split(":")[0] in peer["first"][1], (peer, bad)
    assert peer["took"] < 1.0 and bad["took"] < 1.0, (peer["took"], bad["took"])
    for r in (peer, bad):  # every later call raises at once, saying why
        assert r["later"][0] == "GroupBrokenError" and r["later_took"] < 0.1, r


@pytest.mark.parametrize("case", ONE_RANK_BAD)
def test_checked_mode_ships_one_ranks_error_to_every_rank_and_the_group_stays_usable(case: str) -> None:
    peer, bad = simulate(2, _one_rank_bad, case, checked=True, timeout=30)
    assert peer["first"][0] == bad["first"][0] != "ok", (peer, bad)
    assert "rank 1" in peer["first"][1]
    assert peer["later"] == bad["later"] == ("ok", 200)


def _same_bad_everywhere(ctx: idist.DistContext) -> tuple[str, int]:
    try:
        ctx.broadcast(1.0, src=7)
    except idist.CollectiveInputError as exc:
        first = type(exc).__name__
    return first, ctx.all_reduce(ctx.rank + 1)


@pytest.mark.parametrize("checked", [False, True])
def test_the_same_bad_input_on_every_rank_keeps_the_group_usable(checked: bool) -> None:
    assert simulate(2, _same_bad_everywhere, checked=checked) == [("CollectiveInputError", 3)] * 2


def _bad_group_beside_a_subgroup(ctx: idist.DistContext) -> tuple[str, float, str]:
    ctx.all_reduce(1, group=[0, 1])  # the subgroup's comm exists on its members
    start = time.monotonic()
    try:
        if ctx.rank == 0:
            ctx.all_reduce(1, group=[0, 1])  # waits in the subgroup for rank 1
        elif ctx.rank == 1:
            ctx.all_reduce(1, group=[0, 7])  # a bad group: its failure is counted on the world and the subgroup
        first = "ok"
    except idist.IdistError as exc:
        first = type(exc).__name__
    took = time.monotonic() - start
    try:
        later = str(ctx.all_reduce(1, group=[0, 1]) if ctx.rank < 2 else "not a member")
    except idist.IdistError as exc:
        later = type(exc).__name__
    return first, took, later


def test_a_bad_group_on_one_rank_breaks_a_subgroup_its_peer_waits_in() -> None:
    peer, bad, other = simulate(3, _bad_group_beside_a_subgroup, checked=False, timeout=30)
    assert bad[0] == "CollectiveInputError" and peer[0] == "GroupBrokenError", (peer, bad)
    assert peer[1] < 1.0 and bad[1] < 1.0, (peer, bad)
    assert peer[2] == bad[2] == "GroupBrokenError" and other[0] == "ok", (peer, bad, other)


def _mismatch(ctx: idist.DistContext, what: str) -> tuple[str, str]:
    try:
        if what == "call":
            ctx.all_reduce(1) if ctx.rank == 0 else ctx.barrier()
        else:
            dtype = torch.float32 if ctx.rank == 0 else (torch.int32 if what == "dtype" else torch.float64)
            ctx.all_reduce(torch.ones(3 + ctx.rank * (what == "shape"), dtype=dtype))
    except idist.IdistError as exc:
        return type(exc).__name__, str(exc)
    return "ok", ""


@pytest.mark.parametrize("what", ["call", "dtype", "width", "shape"])
def test_checked_mode_names_mismatched_calls_dtypes_and_shapes(what: str) -> None:
    for name, text in simulate(2, _mismatch, what, checked=True):
        assert name == "CollectiveMismatchError", text
        assert "rank" in text and "site" in text  # the per-rank table


def _absent(ctx: idist.DistContext, seconds: float) -> tuple[str, str, float]:
    start = time.monotonic()
    if ctx.rank == 1:
        time.sleep(seconds)  # absent from rank 0's collective for longer than the checked wait
        return "slept", "", 0.0
    try:
        ctx.all_reduce(1)
    except idist.IdistError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "ok", "", 0.0


def test_checked_mode_names_an_absent_rank_without_a_section_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A context as in production (the group's timeout 30 minutes, the guard's own checked wait):
    the checked wait names the absent rank. A simulated world waits for its run's timeout instead
    (tests/test_testing_simulate.py). The ranks' groups meet in memory: gloo in threads flakes."""
    from torch._C._distributed_c10d import HashStore

    from idist._backends.native import _guard
    from idist.testing._transport import Hub

    monkeypatch.setattr(_guard, "CHECKED_WAIT", 1.0)
    store, hub = HashStore(), Hub(2)
    out: dict[int, tuple[str, str, float]] = {}

    def rank(r: int) -> None:
        groups = lambda ranks, g: hub.group(ranks, g, 1800.0)
        ctx = idist.NativeContext.in_process(store, r, 2, checked=True, groups=groups)
        try:
            out[r] = _absent(ctx, 4.0)
        finally:
            ctx.close()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    name, text, took = out[0]
    assert name == "CollectiveTimeoutError", text
    assert "[1]" in text and took < 3.5, (text, took)


def test_duplicate_group_ranks_are_refused() -> None:
    with pytest.raises(idist.CollectiveInputError, match="repeat"):
        idist.all_reduce(1, group=[0, 0])


def _meta_everywhere(ctx: idist.DistContext) -> list[str]:
    out = []
    for call in (
        lambda: ctx.all_reduce(torch.ones(2, device="meta")),
        lambda: ctx.all_gather(torch.ones(2, device="meta")),
        lambda: ctx.broadcast(torch.ones(2, device="meta"), src=0),
    ):
        try:
            call()
            out.append("ok")
        except idist.CollectiveInputError as exc:
            out.append(type(exc).__name__)
    out.append(str(ctx.all_reduce(1)))  # still usable
    return out


@pytest.mark.parametrize("checked", [False, True])
def test_meta_tensors_raise_on_every_rank(checked: bool) -> None:
    for r in simulate(2, _meta_everywhere, checked=checked):
        assert r == ["UnsupportedValueError"] * 3 + ["2"], r


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"MASTER_PORT": "70000"}, "MASTER_PORT='70000' is out of range"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT='http' is not an integer"),
        ({"RANK": "-1"}, "RANK='-1' is out of range"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' is out of range"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
    ],
)
def test_bad_launcher_values_raise_launch_environment_error(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], says: str
) -> None:
    base = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for k, v in {**base, **env}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(idist.LaunchEnvironmentError, match=says):
        idist.initialize("gloo")


def _forever(ctx: idist.DistContext) -> None:
    if ctx.rank == 1:
        while True:
            pass
    ctx.all_reduce(1)


def test_a_simulate_timeout_leaves_no_rank_thread_running_python() -> None:
    start = time.monotonic()
    with pytest.raises(WorldTimeoutError):
        simulate(2, _forever, timeout=3)
    assert time.monotonic() - start < 6
    time.sleep(0.5)
    assert [t.name for t in threading.enumerate() if t.name.startswith("idist-sim")] == []


# ------------------------------------------------------------ real processes
def _one_bad_process(rank: int) -> tuple[str, str, float]:
    ctx = idist.initialize("gloo", timeout=60)
    try:
        start = time.monotonic()
        try:
            ctx.broadcast(torch.ones(3), src=5 if rank == 1 else 0)
        except idist.IdistError as exc:
            return type(exc).__name__, str(exc), time.monotonic() - start
        return "ok", "", 0.0
    finally:
        idist.finalize()


def test_one_bad_process_breaks_the_default_group_of_every_process() -> None:
    peer, bad = run_ranks(_one_bad_process, 2, timeout=120)
    assert bad[0] == "CollectiveInputError" and peer[0] == "GroupBrokenError", (peer, bad)
    assert "rank 1" in peer[1] and peer[2] < 1.0, peer


@pytest.mark.skipif(subprocess.run(["which", "ss"], capture_output=True).returncode != 0, reason="no ss here")
def test_one_node_launches_listen_on_loopback_only() -> None:
    from launch_fns import listeners

    loopback = ("127.0.0.1:", "[::1]:")
    with idist.Parallel(backend="gloo", nproc_per_node=2) as parallel:
        by_parallel = parallel.run(listeners, False)
    for ports in [*idist.spawn(listeners, nprocs=2), *by_parallel]:
        assert len(ports) >= 1 and all(p.startswith(loopback) for p in ports), ports  # store and gloo
    proc = run_py(["-m", "idist", "run", "-n", "2", str(SCRIPTS / "listeners.py")], timeout=120)
    assert proc.returncode == 0, proc.stderr
    ports = [line.split()[3] for line in proc.stdout.splitlines() if "LISTEN " in line]
    assert len(ports) >= 3 and all(p.startswith(loopback) for p in ports), proc.stdout


def test_idist_run_prefixes_each_line_once() -> None:
    proc = run_py(["-m", "idist", "run", "-n", "2", str(SCRIPTS / "report.py"), "--fail-rank", "1", "--how", "raise"])
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.startswith("[rank1]:")]
    assert lines and not any(line.startswith("[rank1]:[rank1]") for line in lines), proc.stderr
    assert any("Traceback" in line for line in lines)
