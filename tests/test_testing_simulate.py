"""``idist.testing.simulate`` / ``SimulatedWorld``: the simulated-world contract, checked directly."""

from __future__ import annotations

import contextvars
import math
import resource
import struct
import threading
import time
from typing import Any

import pytest
import torch

import idist
from idist import DistContext
from idist.testing import RankFailedError, SimulatedWorld, WorldTimeoutError, simulate

OUTER: contextvars.ContextVar[str] = contextvars.ContextVar("outer", default="unset")


def _rank_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("idist-sim-")]


@pytest.fixture(autouse=True)
def _no_threads_left() -> Any:
    yield
    deadline = time.monotonic() + 10
    while _rank_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _rank_threads(), "simulate left rank threads behind"


def test_results_in_rank_order_and_each_rank_current() -> None:
    def probe(ctx: DistContext, base: int) -> tuple[int, int, bool, int, float, list[int]]:
        return (
            idist.get_rank(),
            idist.get_world_size(),
            idist.current() is ctx,
            ctx.all_reduce(base + ctx.rank),
            idist.all_reduce(0.5),
            idist.all_gather(ctx.rank * 10),
        )

    got = simulate(4, probe, 100)
    assert got == [(r, 4, True, 406, 2.0, [0, 10, 20, 30]) for r in range(4)]


def test_each_rank_runs_in_a_fresh_contextvars_context() -> None:
    OUTER.set("caller")

    def probe(ctx: DistContext) -> tuple[str, str]:
        seen = OUTER.get()
        OUTER.set(f"rank{ctx.rank}")  # must not leak to other ranks or the caller
        ctx.barrier()
        return seen, OUTER.get()

    with idist.context("serial") as outer:
        assert simulate(3, probe) == [("unset", f"rank{r}") for r in range(3)]
        assert idist.current() is outer  # the caller's scoped context is untouched
    assert OUTER.get() == "caller"


def test_a_failing_rank_is_named_and_chained_promptly() -> None:
    def fail_on_one(ctx: DistContext) -> torch.Tensor:
        if ctx.rank == 1:
            raise KeyError("only on rank 1")
        return ctx.all_reduce(torch.ones(2))  # the others block here until rank 1 is gone

    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        simulate(3, fail_on_one, timeout=60)
    assert time.monotonic() - start < 30, "peers blocked on a failed rank must fail fast, not at the timeout"
    err = info.value
    assert err.rank == 1 and err.world_size == 3
    assert isinstance(err.__cause__, KeyError) and err.exception is err.__cause__
    assert next(iter(err.failures)) == 1
    assert "rank 1 of 3 failed: KeyError" in str(err)


def test_an_error_raised_on_every_rank_reports_the_first() -> None:
    def bad(ctx: DistContext) -> object:
        return ctx.broadcast(1, src=7)

    with pytest.raises(RankFailedError) as info:
        simulate(2, bad)
    assert isinstance(info.value.__cause__, idist.CollectiveInputError)
    assert sorted(info.value.failures) == [0, 1]


def test_a_timeout_names_the_ranks_that_did_not_finish() -> None:
    def stuck(ctx: DistContext) -> int:
        if ctx.rank == 2:
            time.sleep(2.5)  # never reaches the collective in time
            return -1
        return ctx.all_reduce(1)

    start = time.monotonic()
    with pytest.raises(WorldTimeoutError) as info:
        simulate(3, stuck, timeout=1.0)
    assert time.monotonic() - start < 1.8
    assert 2 in info.value.unfinished
    assert "did not finish within 1s" in str(info.value)


def test_a_world_is_reused_and_rebuilt_after_a_failure() -> None:
    def whoami(ctx: DistContext) -> tuple[int, int]:
        return ctx.rank, id(ctx)

    def boom(ctx: DistContext) -> None:
        raise ValueError(ctx.rank)

    with SimulatedWorld(2) as world:
        first = world.run(whoami)
        assert world.run(whoami) == first  # same contexts, same threads
        with pytest.raises(RankFailedError):
            world.run(boom)
        again = world.run(whoami)
        assert [r for r, _ in again] == [0, 1]
        assert world.run(lambda ctx: ctx.all_reduce(ctx.rank + 1)) == [3, 3]
    world.close()  # twice is fine


def test_threads_are_gone_after_success_and_failure() -> None:
    before = threading.active_count()
    simulate(3, lambda ctx: ctx.all_gather(ctx.rank))
    with pytest.raises(RankFailedError):
        simulate(3, lambda ctx: 1 / ctx.rank)
    assert threading.active_count() == before


@pytest.mark.parametrize("size", [0, -1, 1.5, True, "2"])
def test_bad_world_size_is_a_value_error(size: Any) -> None:
    with pytest.raises(ValueError, match="world_size") as info:
        simulate(size, lambda ctx: None)
    assert isinstance(info.value, idist.LaunchConfigError)


def test_bad_timeout_is_rejected() -> None:
    with pytest.raises(ValueError, match="timeout"):
        simulate(2, lambda ctx: None, timeout=0)


def test_a_world_of_one() -> None:
    t = torch.arange(3.0)
    assert simulate(1, lambda ctx, x: ctx.all_reduce(x.clone()).tolist(), t) == [[0.0, 1.0, 2.0]]


def test_an_average_on_one_rank_keeps_every_bit_as_serial_does() -> None:
    """A world of one is serial: AVERAGE divides by nothing, so a signalling NaN keeps its bits
    (dividing by 1 would quiet it). Found by properties/test_serial.py."""
    snan = torch.tensor([0x7F800001, 0x3F800000], dtype=torch.int32).view(torch.float32)
    with idist.context("serial") as serial:
        expected = serial.all_reduce(snan.clone(), "AVERAGE").view(torch.int32).tolist()
    (got,) = simulate(1, lambda ctx, x: ctx.all_reduce(x.clone(), "AVERAGE").view(torch.int32).tolist(), snan)
    assert got == expected == [0x7F800001, 0x3F800000]


# ------------------------------------------------------- arguments: a copy each
def _append(ctx: DistContext, items: list[int]) -> int:
    items.append(ctx.rank)
    ctx.barrier()
    return len(items)


def test_each_rank_gets_its_own_copy_of_the_arguments() -> None:
    items: list[int] = []
    assert simulate(2, _append, items) == [1, 1]  # as processes give: each its own list
    assert items == []  # the caller's object is untouched
    assert simulate(2, _append, items, share_args=True) == [2, 2]  # sharing is asked for
    assert sorted(items) == [0, 1]


def _ddp_step(ctx: DistContext, model: torch.nn.Module, batches: torch.Tensor) -> list[float]:
    ddp = ctx.auto_model(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    ddp(batches[ctx.rank]).sum().backward()
    opt.step()
    return [p.item() for p in model.parameters()]


def test_a_ddp_step_on_a_passed_model_is_the_averaged_step_on_every_rank() -> None:
    model = torch.nn.Linear(1, 1)
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.fill_(0.0)
    batches = torch.tensor([[[1.0]], [[3.0]]])  # rank r's batch: the mean gradient of w is 2
    for _ in range(6):
        assert simulate(2, _ddp_step, model, batches) == [[0.0, -0.5]] * 2  # w: 1 - 0.5 * 2, b: -0.5 * 1
    assert [p.item() for p in model.parameters()] == [1.0, 0.0]


def _copied(ctx: DistContext, base: torch.Tensor, view: torch.Tensor, args: dict[str, Any]) -> list[object]:
    view[0] = 10.0 + ctx.rank  # a view of base in the caller is one in each rank's copy too
    leaf, param, graded = args["leaf"], args["param"], args["graded"]
    return [base[1].item(), leaf.requires_grad, leaf.is_leaf, type(param).__name__, graded.grad.tolist()]


def test_each_copy_is_what_deepcopy_makes_of_the_arguments() -> None:
    base = torch.zeros(3)
    graded = torch.ones(2, requires_grad=True)
    graded.grad = torch.full((2,), 5.0)
    args = {"leaf": torch.ones(2, requires_grad=True), "param": torch.nn.Parameter(torch.ones(2)), "graded": graded}
    got = simulate(2, _copied, base, base[1:], args)
    assert got == [[10.0, True, True, "Parameter", [5.0, 5.0]], [11.0, True, True, "Parameter", [5.0, 5.0]]]
    assert base.tolist() == [0.0, 0.0, 0.0]


def test_arguments_that_cannot_be_copied_raise_before_any_rank_runs() -> None:
    ran: list[int] = []
    with pytest.raises(idist.UnsupportedValueError, match="share_args=True"):
        simulate(2, lambda ctx, lock: ran.append(ctx.rank), threading.Lock())
    assert ran == []


# ------------------------------------------------------------------ blame
def _leader_fails(ctx: DistContext, local: bool) -> None:
    with idist.one_rank_first(local=local):
        if ctx.rank == 0:
            raise ValueError("download failed")


def _only_fails(ctx: DistContext) -> None:
    @idist.one_rank_only(rank=1)
    def save() -> None:
        raise OSError("disk full")

    save()


def test_blame_goes_to_the_rank_whose_own_exception_started_the_failure() -> None:
    for i in range(12):
        with pytest.raises(RankFailedError) as info:
            simulate(2, _leader_fails, i % 2 == 0)
        assert info.value.rank == 0 and isinstance(info.value.__cause__, ValueError), info.value
        assert isinstance(info.value.failures[1], idist.LeaderFailedError)
        with pytest.raises(RankFailedError) as info:
            simulate(3, _only_fails)
        assert info.value.rank == 1 and isinstance(info.value.__cause__, OSError), info.value


def test_an_error_every_rank_raised_alike_is_blamed_on_the_lowest_rank() -> None:
    for _ in range(8):
        with pytest.raises(RankFailedError) as info:
            simulate(3, lambda ctx: ctx.broadcast(1, src=7))
        assert info.value.rank == 0 and sorted(info.value.failures) == [0, 1, 2]


# ---------------------------------------------------- failing fast, and alone
def _fail_while_peers_wait(ctx: DistContext) -> int:
    if ctx.rank == 1:
        raise KeyError("only on rank 1")
    return ctx.all_reduce(1)


def _return_while_peers_wait(ctx: DistContext) -> int:
    return ctx.all_reduce(1) if ctx.rank == 0 else -1  # rank 1 skips the collective


@pytest.mark.parametrize("checked", [True, False])
def test_a_failing_run_ends_within_half_a_second(checked: bool) -> None:
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        simulate(3, _fail_while_peers_wait, checked=checked, timeout=60)
    assert time.monotonic() - start < 0.5
    assert info.value.rank == 1 and isinstance(info.value.__cause__, KeyError)
    for r in (0, 2):  # the peers say why they stopped
        assert isinstance(info.value.failures[r], idist.GroupBrokenError)
        assert "rank 1, which raised KeyError" in str(info.value.failures[r])
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        simulate(2, _return_while_peers_wait, checked=checked, timeout=60)
    assert time.monotonic() - start < 1.0  # the guard's look at who arrived (0.25 s), not the timeout
    assert info.value.rank == 0 and isinstance(info.value.__cause__, idist.PeerLostError)
    assert "rank 1 returned from its function" in str(info.value.__cause__)


def _break_then_catch(ctx: DistContext) -> str:
    try:
        ctx.broadcast(1.0, src=0 if ctx.rank == 0 else 5)  # one rank's bad input breaks an unchecked group
    except idist.IdistError as exc:
        return type(exc).__name__
    return "ok"


def test_a_run_that_broke_the_group_and_returned_does_not_poison_the_next() -> None:
    with SimulatedWorld(2, checked=False) as world:
        assert sorted(world.run(_break_then_catch)) == ["CollectiveInputError", "GroupBrokenError"]
        assert world.run(lambda ctx: ctx.all_reduce(ctx.rank + 1)) == [3, 3]


# --------------------------------------------------------------- timeouts
def _slow_leader(ctx: DistContext, seconds: float) -> int:
    with idist.one_rank_first():
        if ctx.rank == 0:
            time.sleep(seconds)  # a download, longer than checked mode's own wait
    return ctx.broadcast(ctx.rank + 7, src=0)


def test_the_runs_timeout_governs_checked_modes_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    from idist._backends.native import _guard

    monkeypatch.setattr(_guard, "CHECKED_WAIT", 0.2)  # a production default shorter than the download
    assert simulate(2, _slow_leader, 0.6, checked=True, timeout=30) == [7, 7]


def _late_peer(ctx: DistContext) -> str:
    if ctx.rank == 1:
        time.sleep(0.8)
        return "late"
    try:
        with ctx.timeout(0.3):
            ctx.broadcast(torch.ones(2), src=0)
    except idist.CollectiveTimeoutError as exc:
        return str(exc)
    return "ok"


def test_an_error_names_the_call_the_user_made() -> None:
    with SimulatedWorld(2, checked=True) as world:
        message, late = world.run(_late_peer)
    assert late == "late"
    assert message.startswith("broadcast") and "all_reduce" not in message, message


def test_no_timeout_is_math_inf() -> None:
    assert simulate(2, lambda ctx: ctx.all_reduce(1), timeout=math.inf) == [2, 2]
    with pytest.raises(ValueError, match="timeout"):
        simulate(2, lambda ctx: None, timeout=math.nan)


# -------------------------------------------------------------- the rest
def test_pytest_skip_in_a_rank_skips_the_test() -> None:
    def skip_on_one(ctx: DistContext) -> int:
        if ctx.rank == 1:
            pytest.skip("needs a GPU on rank 1")
        return ctx.all_reduce(1)

    with pytest.raises(pytest.skip.Exception, match="needs a GPU"):
        simulate(2, skip_on_one)


def test_a_size_past_the_limit_is_refused_before_any_rank_starts() -> None:
    from idist.testing._threads import MAX_WORLD_SIZE

    ran: list[int] = []
    with pytest.raises(idist.LaunchConfigError, match="at most") as info:
        simulate(MAX_WORLD_SIZE + 1, lambda ctx: ran.append(ctx.rank))
    assert isinstance(info.value, ValueError) and ran == []


def test_a_world_the_system_cannot_start_fails_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    started = 0
    original = threading.Thread.start

    def start_three(self: threading.Thread) -> None:
        nonlocal started
        if self.name.startswith("idist-sim-"):
            started += 1
            if started > 3:
                raise RuntimeError("can't start new thread")
        original(self)

    monkeypatch.setattr(threading.Thread, "start", start_three)
    ran: list[int] = []
    with pytest.raises(idist.LaunchConfigError, match="could not start 8 simulated ranks"):
        simulate(8, lambda ctx: ran.append(ctx.rank))
    assert ran == []


def _many(ctx: DistContext) -> tuple[int, int, int]:
    evens = ctx.all_reduce(1, group=list(range(0, ctx.world_size, 2)))
    return ctx.all_reduce(ctx.rank), evens, len(ctx.all_gather(ctx.rank))


def test_256_ranks_run_in_one_process_under_ulimit_n_1024() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))  # the common default
    try:
        n = 256
        got = simulate(n, _many)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert got == [(n * (n - 1) // 2, n // 2 if r % 2 == 0 else 1, n) for r in range(n)]


# ------------------------------------------------------------ the pytest plugin
@pytest.mark.simulated_world(3, 5, False)
def test_the_marker_takes_its_arguments_by_position(simulated_world: SimulatedWorld) -> None:
    assert (simulated_world.world_size, simulated_world.timeout, simulated_world.checked) == (3, 5.0, False)
    assert simulated_world.run(lambda ctx: ctx.checked) == [False] * 3


@pytest.mark.simulated_world(world_size=2, share_args=True)
def test_the_marker_takes_share_args(simulated_world: SimulatedWorld) -> None:
    items: list[int] = []
    assert simulated_world.run(_append, items) == [2, 2] and simulated_world.share_args


@pytest.mark.parametrize(
    ("mark", "says"),
    [
        (pytest.mark.simulated_world(size=4), "size"),
        (pytest.mark.simulated_world(2, 5, False, True), "positional"),
        (pytest.mark.simulated_world(checked="no"), "checked must be True or False"),
        (pytest.mark.simulated_world(2, timeout=0), "timeout"),
        (pytest.mark.simulated_world(0), "world_size"),
    ],
)
def test_a_marker_the_fixture_cannot_honour_is_a_usage_error(mark: pytest.MarkDecorator, says: str) -> None:
    from idist.testing.pytest_plugin import _options

    class Node:
        def get_closest_marker(self, name: str) -> pytest.Mark:
            return mark.mark

    class Request:
        node = Node()

    with pytest.raises(pytest.UsageError, match=says):
        _options(Request())  # type: ignore[arg-type]


def _nan_product(ctx: DistContext, values: list[float]) -> str:
    return struct.pack("<d", ctx.all_reduce(values[ctx.rank], "PRODUCT")).hex()


def test_ranks_agree_on_the_bits_of_a_nan_however_warm_the_interpreter_is() -> None:
    # NaN * NaN has either NaN's sign depending on which of CPython's two multiplies runs: one
    # before an instruction is specialized, one after, and simulated ranks share the code
    plus, minus = (struct.unpack("<d", struct.pack("<Q", bits))[0] for bits in (0x7FF8000000000001, 0xFFF8000000000001))
    values = [1.5, plus, -2.0, minus]
    with SimulatedWorld(4) as world:
        seen = {bits for _ in range(30) for bits in world.run(_nan_product, values)}
    assert len(seen) == 1, seen
