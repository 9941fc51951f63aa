"""idist's own machinery at O(1) store requests per rank: liveness, join, failure diagnosis and
the store's size, measured at a real TCPStore behind a proxy that counts what it serves.

Simulated ranks in threads of this process, each with its own store connection, run idist's real
code (the heartbeat, ``join``, ``Guard.report``); only the processes around them are missing.
Small worlds here (the same code at 64 to 4,096 ranks is benchmarks/bench_scale.py). The limits
of the issue: in steady state at most one request and two key operations per rank per second,
and O(N) requests in all for a join or a diagnosis.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch._C._distributed_c10d import HashStore, PrefixStore, TCPStore

import idist
from idist._backends.native import _rendezvous
from idist._backends.native._guard import Guard
from idist._backends.native._liveness import Heartbeat, heartbeat
from idist._backends.native._verdict import Fault, Verdict
from store_counter import CountingProxy, simulated_rank

pytestmark = pytest.mark.timeout(120)

TIMEOUT = datetime.timedelta(seconds=30)


@pytest.fixture
def store() -> Iterator[tuple[TCPStore, CountingProxy]]:
    """A real store (libuv, as idist serves it) and a counting proxy in front of it."""
    server = TCPStore("127.0.0.1", 0, 1, True, timeout=TIMEOUT, use_libuv=True, wait_for_workers=False)
    yield server, CountingProxy(server.port).start()


def _client(proxy: CountingProxy) -> TCPStore:
    return TCPStore("127.0.0.1", proxy.port, 1, False, timeout=TIMEOUT)


def _clients(proxy: CountingProxy, n: int) -> list[TCPStore]:
    """``n`` connections, made at once (torch takes ~0.15 s to open one here)."""
    return _in_threads(n, lambda _: _client(proxy))


def _in_threads(n: int, fn: Callable[[int], Any]) -> list[Any]:
    out: list[Any] = [None] * n

    def run(r: int) -> None:
        try:
            out[r] = fn(r)
        except Exception as exc:
            out[r] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def _beats(proxy: CountingProxy, world: int, nproc: int, limit: float) -> list[Heartbeat]:
    clients = _clients(proxy, world)

    def make(r: int) -> Heartbeat:
        beat = heartbeat(
            clients[r], simulated_rank(r, world, nproc), limit, prefix="t/live", store_node=0, watch_main=False
        )
        assert beat is not None
        return beat

    beats: list[Heartbeat] = _in_threads(world, make)
    for beat in beats:
        beat.start()
    return beats


def _names(beat: Heartbeat, world: int) -> set[int]:
    lost = beat.lost(range(world))
    return set(lost.ranks) if lost is not None else set()


def _until(what: Callable[[], Any], seconds: float) -> tuple[Any, float]:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if found := what():
            return found, time.monotonic() - start
        time.sleep(0.02)
    return None, time.monotonic() - start


# --------------------------------------------------------------------------------- liveness
def test_steady_state_costs_at_most_one_request_and_two_keys_per_rank_per_second(store: Any) -> None:
    """16 ranks on 4 nodes at the default limit (30 s): one beat per node a second, the monitor's
    read, nothing else (today: every rank sets its key and reads all 16, 3 requests and 17 keys)."""
    _, proxy = store
    world, nproc = 16, 4
    beats = _beats(proxy, world, nproc, 30.0)
    try:
        time.sleep(1.5)  # every monitor and speaker settled
        proxy.reset()
        start = time.monotonic()
        time.sleep(3.0)
        got = proxy.stats()
        seconds = time.monotonic() - start  # a loaded machine sleeps longer: count per second seen
    finally:
        for beat in beats:
            beat.stop()
    per_rank = {k: got[k] / world / seconds for k in ("requests", "keys")}
    assert per_rank["requests"] <= 1.0 and per_rank["keys"] <= 2.0, got
    assert got["requests"] > 0, got  # the nodes do beat: (4 - 1) beats + 2 for the monitor's read, a second
    # 1.25 a node a second, with room for a round that lands in the window early (before: 12)
    assert nproc * per_rank["requests"] <= 2.0, got


def test_a_lost_node_a_lost_rank_and_a_lost_speaker_are_named_within_the_limit(store: Any) -> None:
    """Limit 1 s. Node 3 goes silent: rank 0 (on the monitor's node) names its 4 ranks. Then rank 5
    alone (a rank that does not speak for node 1): named, node 1 is not. Then rank 8, node 2's
    speaker: rank 9 speaks for the node from then on, and only rank 8 is named."""
    _, proxy = store
    world, nproc, limit = 16, 4, 1.0
    beats = _beats(proxy, world, nproc, limit)
    try:
        time.sleep(0.5)
        watcher = beats[0]
        gone: set[int] = set()
        for case, silent in (("node", range(12, 16)), ("rank", [5]), ("speaker", [8])):
            for r in silent:
                beats[r].stop()
            gone |= set(silent)
            lost, took = _until(lambda g=set(gone): (x := watcher.lost(range(world))) and set(x.ranks) == g and x, 5.0)
            assert lost is not None, (case, watcher.lost(range(world)))
            assert limit - 0.2 <= took <= limit + 2.0, (case, took)
            assert "no heartbeat from them" in lost.why and "liveness limit 1s" in lost.why, lost
            for other in (beats[1], beats[10]):  # every rank alive sees the same, within a second more
                found, _ = _until(lambda o=other, g=set(gone): _names(o, world) == g, 2.0)
                assert found, (case, other.topology.rank, other.lost(range(world)))
    finally:
        for beat in beats:
            beat.stop()


def test_a_store_that_stops_answering_is_named_by_its_address_while_the_watcher_goes_on(store: Any) -> None:
    """2 nodes of 2 ranks, the store on node 0. The proxy swallows every request from then on (a
    partition): node 1's beat never returns. Within the limit and a second, node 1's ranks name node
    0's ranks and the store by its address; their watcher kept ticking meanwhile."""
    _, proxy = store
    beats = _beats(proxy, 4, 2, 1.0)
    try:
        time.sleep(0.5)
        proxy.frozen.set()
        start = time.monotonic()
        lost, took = _until(lambda: beats[2].lost(range(4)), 5.0)
        assert lost is not None and lost.ranks == (0, 1), lost
        assert f"the store at 127.0.0.1:{proxy.port} stopped answering" in lost.why, lost
        assert 0.8 <= took <= 3.0, took  # the limit since the last answer (up to an interval before)
        ticks = beats[3].board.slots()[1].tick
        time.sleep(0.5)
        assert beats[3].board.slots()[1].tick > ticks  # the watcher never waits for the store
        assert beats[3].lost([2, 3]) is None  # a group of node 1 alone does not need the store
        assert time.monotonic() - start < 5.0
    finally:
        _in_threads(len(beats), lambda r: beats[r].stop())  # each waits a second for its hung call


# ------------------------------------------------------------------------------------- join
@pytest.mark.parametrize("absent", [None, 7], ids=["all", "one-missing"])
def test_join_costs_o_n_requests_and_names_the_missing_rank_once(
    store: Any, absent: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """32 ranks join (today: each polls every rank's key, then checks each: N^2 requests); with
    rank 7 absent, every rank raises naming it (and its node) after the rendezvous timeout."""
    _, proxy = store
    world, nproc = 32, 8
    monkeypatch.setenv(_rendezvous.RDZV_TIMEOUT_VAR, "3")  # 31 threads and the proxy share the GIL
    clients = _clients(proxy, world)
    proxy.reset()
    ranks = [r for r in range(world) if r != absent]
    out = _in_threads(
        len(ranks), lambda i: _rendezvous.join(clients[ranks[i]], simulated_rank(ranks[i], world, nproc), TIMEOUT, "x")
    )
    got = proxy.stats()
    if absent is None:
        assert out == [None] * world
        assert got["requests"] <= 5 * world, got
    else:
        for exc in out:
            assert isinstance(exc, idist.RendezvousTimeoutError), exc
            assert "ranks [7] (node 0) did not join" in str(exc), exc
        assert got["requests"] <= 10 * world, got["ops"]  # a timed-out wait is cancelled: one request more


# ------------------------------------------------------------------------------- diagnosis
def test_a_failure_diagnosis_costs_o_n_requests_and_names_the_absent_rank(store: Any) -> None:
    """31 of 32 ranks report that they reached a collective that failed (``Guard.report``): every
    one names rank 13, and the store served O(N) requests (today: each polls every rank's key)."""
    _, proxy = store
    world = 32
    clients = [PrefixStore("t/guard", c) for c in _clients(proxy, world)]
    proxy.reset()
    verdict = Verdict("all_reduce", tuple(range(world)), Fault.LOST)

    def report(r: int) -> Verdict:
        step = SimpleNamespace(seq=5)
        comm: Any = SimpleNamespace(key="world", ranks=tuple(range(world)), group_rank=r, lockstep=step)
        # the whole grace (3 s): 31 threads of a loaded machine may count in more than 1 s apart
        guard = Guard(clients[r], datetime.timedelta(seconds=3))
        return guard.report(comm, verdict, guard.count_in(comm))

    out = _in_threads(world - 1, lambda i: report(i if i < 13 else i + 1))
    got = proxy.stats()
    assert all(isinstance(v, Verdict) and v.missing == (13,) for v in out), out
    assert got["requests"] <= 30 * world, got


@pytest.mark.parametrize("absent", [None, 13], ids=["all-fail-alike", "one-did-not-fail"])
def test_agreeing_on_a_failure_costs_o_n_keys(store: Any, absent: int | None) -> None:
    """32 ranks fail before communicating (``Guard.agree``): when all fail at the same call every
    one keeps the group, when rank 13 did not every other breaks it; either way the store served
    O(N) requests and keys (before: each rank polled every rank's key for 0.3 s, N^2 keys)."""
    _, proxy = store
    world = 32
    clients = [PrefixStore("t/guard", c) for c in _clients(proxy, world)]
    proxy.reset()
    exc = idist.CollectiveInputError("src=7 is outside 0..31")

    def agree(r: int) -> Verdict | None:
        step = SimpleNamespace(seq=5, agreed=0)
        # with an absent rank, slice=None: a group whose waits cannot look (nccl), where the absent
        # rank costs the blind window (0.3 s) and not the timeout; when all fail, a gloo group's
        # wait (a slice), which waits for the others up to the timeout: 32 threads on a loaded
        # machine may arrive more than 0.3 s apart
        waits = None if absent is not None else 1.0
        comm: Any = SimpleNamespace(key="world", ranks=tuple(range(world)), group_rank=r, lockstep=step, slice=waits)
        return Guard(clients[r], TIMEOUT).agree(comm, "broadcast", exc)

    ranks = [r for r in range(world) if r != absent]
    out = _in_threads(len(ranks), lambda i: agree(ranks[i]))
    got = proxy.stats()
    if absent is None:
        assert out == [None] * world, out
    else:
        assert all(isinstance(v, Verdict) and v.fault is Fault.BROKEN for v in out), out
    assert got["requests"] <= 8 * world and got["keys"] <= 8 * world, got


# ----------------------------------------------------------------------------- store size
def test_creating_groups_leaves_the_store_s_key_count_flat() -> None:
    """4 simulated ranks create every subgroup of 2 and 3 ranks in turn and reduce on each: after
    each, the store holds as many keys as before it (today: each group leaves a key per member,
    under a prefix as long as its rank list)."""
    world = 4
    store = HashStore()
    groups = [(a, b) for a in range(4) for b in range(a + 1, 4)] + [(0, 1, 2), (1, 2, 3), (0, 2, 3), (0, 1, 3)]
    counts: list[list[int]] = [[] for _ in range(world)]
    barrier = threading.Barrier(world)

    def rank(r: int) -> None:
        ctx = idist.NativeContext.in_process(PrefixStore("sim", store), r, world, timeout=30)
        try:
            ctx.barrier()
            for g in groups:
                ctx.all_reduce(1, group=list(g))
                ctx.barrier()
                barrier.wait()
                counts[r].append(store.num_keys())
                barrier.wait()
        finally:
            ctx.close()

    assert _in_threads(world, rank) == [None] * world
    assert len(set(counts[0])) == 1, counts[0]
    assert all(len(k) < 60 for k in store.list_keys()), store.list_keys()


def test_a_closed_context_leaves_only_its_generation_counters() -> None:
    """3 simulated ranks build a context and a subgroup, reduce on both, and close: the store keeps
    one counter a rank (which context this is on the store), nothing else (today: the world's and
    the group's rendezvous keys stay)."""
    store = HashStore()

    def rank(r: int) -> None:
        ctx = idist.NativeContext.in_process(PrefixStore("sim", store), r, 3, timeout=30)
        ctx.all_reduce(1)
        ctx.all_reduce(torch.ones(3), group=[0, 2])
        ctx.close()

    assert _in_threads(3, rank) == [None, None, None]
    assert sorted(store.list_keys()) == [f"sim/idist/0/gen/{r}" for r in range(3)], store.list_keys()


def _groups_failures_and_close(r: int, world: int, store: Any) -> None:
    """One context: a reduce on the world and on two subgroups, the same bad input on every rank
    (each fails before communicating, the group stays usable), a reduce after it, and close."""
    ctx = idist.NativeContext.in_process(PrefixStore("sim", store), r, world, timeout=30, checked=False)
    try:
        ctx.all_reduce(1)
        for g in ([0, 1], [1, 2]):
            if r in g:
                ctx.all_reduce(torch.ones(2), group=g)
        for _ in range(2):
            with pytest.raises(idist.CollectiveInputError):
                ctx.broadcast(1.0, src=7)
        assert ctx.all_reduce(1) == world
    finally:
        ctx.close()


def test_a_job_of_many_contexts_keeps_the_store_s_key_count_flat() -> None:
    """3 simulated ranks make five contexts in turn on one store: groups, failures that every rank
    shares, close. After each close the store holds one counter a rank and nothing else: flat,
    whatever the number of contexts (before: each failure left a key a rank for good)."""
    world, store = 3, HashStore()
    counts: list[list[str]] = []
    for _ in range(5):
        assert _in_threads(world, lambda r: _groups_failures_and_close(r, world, store)) == [None] * world
        counts.append(sorted(store.list_keys()))
    assert counts == [[f"sim/idist/0/gen/{r}" for r in range(world)]] * 5, counts[-1]


def test_a_board_being_set_up_is_never_swept(tmp_path: Path) -> None:
    """A rank sets up its node's board under a lock: header first, then its pid. A rank of another
    job sweeping boards left by crashes at that moment must leave it (before: it saw no live pid
    and unlinked it, and the node's later ranks made a second board: the node split in two, and
    the 4,096-rank benchmark failed on it)."""
    import fcntl
    import struct

    from idist._backends.native import _board

    path = tmp_path / "idist-live-halfway-n0"
    with open(path, "wb") as f:
        f.write(struct.pack("<qqqq", _board._MAGIC, 2, -1, 1) + bytes(2 * _board._SLOT.size))
    with open(path, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # what NodeBoard.open holds while it writes the pid
        _board.sweep(tmp_path)
        assert path.exists()
    _board.sweep(tmp_path)  # unlocked, with no live pid: a crash's leftover, removed
    assert not path.exists()
