"""What simulated ranks share because they are threads of one process: the threads they
start, process-wide state, and torch.distributed itself."""

from __future__ import annotations

import os
import random
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import idist
from idist import DistContext
from idist.testing import RankFailedError, simulate

Probe = tuple[int, int, int]


def _probe() -> Probe:
    return idist.get_rank(), idist.get_world_size(), idist.all_reduce(idist.get_rank() + 1)


# ------------------------------------------------------------- threads
def _in_a_pool(ctx: DistContext) -> list[Probe]:
    with ThreadPoolExecutor(1) as pool:  # one thread: a rank's collectives happen one at a time
        return list(pool.map(lambda _: _probe(), range(2)))


def _in_a_thread(ctx: DistContext) -> Probe:
    out: list[Probe] = []
    t = threading.Thread(target=lambda: out.append(_probe()))
    t.start()
    t.join()
    return out[0]


def test_threads_a_rank_starts_work_for_that_rank() -> None:
    assert simulate(2, _in_a_pool) == [[(0, 2, 3)] * 2, [(1, 2, 3)] * 2]
    assert simulate(3, _in_a_thread) == [(r, 3, 6) for r in range(3)]
    assert isinstance(idist.current(), idist.SerialContext)  # none of it leaked to this thread


_SHARED = ThreadPoolExecutor(2)  # its threads are started by whichever rank submits first


def _shared_pool(ctx: DistContext) -> Probe:
    return _SHARED.submit(_probe).result()


def test_a_pool_the_ranks_share_runs_each_task_for_the_rank_that_submitted_it() -> None:
    for _ in range(3):
        assert simulate(2, _shared_pool) == [(0, 2, 3), (1, 2, 3)]


def test_a_thread_no_rank_started_gets_a_clear_error_during_a_run() -> None:
    asked, answered = threading.Event(), threading.Event()
    seen: list[object] = []

    def outsider() -> None:  # started by the test, before any rank exists
        asked.wait(30)
        try:
            seen.append(idist.get_rank())
        except idist.ThreadContextError as exc:
            seen.append(exc)
        answered.set()

    t = threading.Thread(target=outsider, name="outsider")
    t.start()

    def fn(ctx: DistContext) -> int:
        if ctx.rank == 0:
            asked.set()
            answered.wait(30)
        ctx.barrier()
        return ctx.rank

    assert simulate(2, fn) == [0, 1]
    t.join()
    assert isinstance(seen[0], idist.ThreadContextError) and "'outsider'" in str(seen[0])
    assert idist.get_rank() == 0  # outside a run the thread's answer is the process's again


def test_initialize_inside_a_rank_refuses_and_leaves_torch_distributed_alone() -> None:
    def fn(ctx: DistContext) -> tuple[str, bool, bool]:
        try:
            idist.initialize("gloo")
            said = "initialized"
        except idist.AlreadyInitializedError as exc:
            said = str(exc)
        idist.finalize()  # harmless in a rank: the rank's context is its runner's
        return said, dist.is_initialized(), idist.current() is ctx

    for said, initialized, current in simulate(2, fn):
        assert "inside a simulated rank" in said and not initialized and current
    assert not dist.is_initialized()


# ------------------------------------------------------------- process-wide state
def _change_everything(ctx: DistContext, folder: str, fail: bool) -> str:
    if ctx.rank == 0:
        torch.set_default_dtype(torch.float64)
        torch.manual_seed(1234)
        random.seed(1234)
        os.environ["IDIST_TEST_ADDED"] = "1"
        os.environ.pop("IDIST_TEST_KEPT", None)
        os.chdir(folder)
        warnings.simplefilter("error")
        torch.set_num_threads(torch.get_num_threads() + 1)
    ctx.barrier()
    if fail and ctx.rank == 1:
        raise ValueError("after the changes")
    return str(torch.get_default_dtype())


@pytest.mark.parametrize("fail", [False, True])
def test_what_a_run_changes_process_wide_is_restored_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: bool
) -> None:
    monkeypatch.setenv("IDIST_TEST_KEPT", "kept")
    torch.manual_seed(7)
    random.seed(7)
    before: dict[str, Any] = {
        "dtype": torch.get_default_dtype(),
        "cwd": os.getcwd(),
        "filters": list(warnings.filters),
        "threads": torch.get_num_threads(),
        "environ": dict(os.environ),
    }
    expected_torch, expected_py = torch.rand(3), random.random()
    torch.manual_seed(7)
    random.seed(7)
    if fail:
        with pytest.raises(RankFailedError):
            simulate(2, _change_everything, str(tmp_path), fail)
    else:
        assert simulate(2, _change_everything, str(tmp_path), fail) == ["torch.float64"] * 2  # shared meanwhile
    assert torch.get_default_dtype() == before["dtype"]
    assert os.getcwd() == before["cwd"]
    assert warnings.filters == before["filters"]
    assert torch.get_num_threads() == before["threads"]
    assert dict(os.environ) == before["environ"]
    assert torch.equal(torch.rand(3), expected_torch) and random.random() == expected_py


def test_a_rank_that_initializes_torch_distributed_leaves_nothing_behind() -> None:
    def fn(ctx: DistContext) -> bool:
        if ctx.rank == 0:
            store = dist.HashStore()
            dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        ctx.barrier()
        return dist.is_initialized()

    assert simulate(2, fn) == [True, True]
    assert not dist.is_initialized()


def _warn(ctx: DistContext) -> int:
    warnings.warn(f"from rank {ctx.rank}", UserWarning, stacklevel=1)
    return ctx.all_reduce(1)


def test_warnings_from_every_rank_reach_a_pytest_warns_around_the_run() -> None:
    with pytest.warns(UserWarning) as record:
        assert simulate(3, _warn) == [3, 3, 3]
    assert sorted(str(w.message) for w in record) == [f"from rank {r}" for r in range(3)]


def test_a_shared_generator_is_documented_and_a_generator_per_rank_is_reproducible() -> None:
    def draw(ctx: DistContext) -> list[float]:
        g = torch.Generator().manual_seed(ctx.rank)  # what docs/testing.md recommends
        time.sleep(0.01 * (1 - ctx.rank))  # whatever order the threads run in
        return torch.rand(2, generator=g).tolist()

    expected = [torch.rand(2, generator=torch.Generator().manual_seed(r)).tolist() for r in range(2)]
    assert simulate(2, draw) == expected
    text = (Path(__file__).parents[1] / "docs" / "testing.md").read_text()
    assert "torch.manual_seed" in text and "ProcessWorld" in text


def test_outside_a_run_threads_see_what_they_saw_and_the_hooks_go_with_the_last_world() -> None:
    from idist.testing import SimulatedWorld

    start, submit = threading.Thread.start, ThreadPoolExecutor.submit
    seen: list[object] = []
    with SimulatedWorld(2) as world:
        assert world.run(lambda ctx: ctx.rank) == [0, 1]
        # the world exists but runs nothing: a thread of the test sees the process's context
        t = threading.Thread(target=lambda: seen.append(idist.current()))
        t.start()
        t.join()
        with idist.context("serial") as outer:
            assert world.run(lambda ctx: idist.current() is ctx) == [True, True]
            assert idist.current() is outer
    assert isinstance(seen[0], idist.SerialContext)
    assert (threading.Thread.start, ThreadPoolExecutor.submit) == (start, submit)
