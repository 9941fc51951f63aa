"""The context stack: initialize/finalize, scoped contexts, threads, adoption, serial."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import idist
from idist import NativeContext, SerialContext


@pytest.fixture(autouse=True)
def _clean() -> object:
    yield
    idist.finalize()
    if dist.is_initialized():
        dist.destroy_process_group()


def test_default_is_serial_and_collectives_are_identity() -> None:
    ctx = idist.current()
    assert isinstance(ctx, SerialContext)
    assert (idist.get_rank(), idist.get_world_size(), idist.get_local_rank()) == (0, 1, 0)
    assert (idist.get_node_rank(), idist.get_nnodes(), idist.get_nproc_per_node()) == (0, 1, 1)
    assert idist.backend() is None and idist.model_name() == "serial"
    t = torch.ones(2)
    assert idist.all_reduce(t) is t
    assert idist.all_reduce(3) == 3 and idist.all_reduce(0.1, "AVERAGE") == 0.1
    assert idist.all_gather(Path("x")) == [Path("x")]
    assert idist.all_gather(t)[0].tolist() == [1.0, 1.0]
    assert idist.broadcast("v") == "v"
    idist.barrier()
    idist.sync()
    with pytest.raises(idist.CollectiveInputError):
        idist.broadcast(1, src=1)
    with pytest.raises(idist.UnsupportedOpError):
        idist.all_reduce(True, "AVERAGE")


def test_initialize_sets_the_default_and_finalize_is_safe_twice() -> None:
    env_before = dict(os.environ)
    ctx = idist.initialize("gloo")
    assert isinstance(ctx, NativeContext) and idist.current() is ctx
    assert ctx.backend == "gloo" and ctx.device == torch.device("cpu")
    assert idist.all_reduce(2.5) == 2.5
    with pytest.raises(idist.AlreadyInitializedError, match="finalize"):
        idist.initialize("gloo")
    idist.finalize()
    idist.finalize()
    assert ctx.closed and not dist.is_initialized()
    assert dict(os.environ) == env_before
    assert isinstance(idist.current(), SerialContext)
    with pytest.raises(idist.ContextClosedError):
        ctx.all_reduce(1)


def test_context_block_is_scoped_and_finalized_on_exception() -> None:
    with pytest.raises(RuntimeError, match="boom"), idist.context("gloo") as ctx:
        assert idist.current() is ctx
        raise RuntimeError("boom")
    assert ctx.closed and not dist.is_initialized()
    with pytest.raises(idist.ContextClosedError, match="finalized"):
        ctx.broadcast(1)
    assert isinstance(idist.current(), SerialContext)


def test_scoped_context_shadows_the_default_and_nests() -> None:
    outer = idist.initialize("serial")
    assert isinstance(outer, SerialContext)
    with idist.context("gloo") as inner:
        assert idist.current() is inner
        with idist.use(outer):
            assert idist.current() is outer
        assert idist.current() is inner
    assert idist.current() is outer


def test_threads_do_not_see_each_others_scoped_context() -> None:
    seen: dict[str, object] = {}
    with idist.context("gloo") as ctx:
        assert idist.current() is ctx

        def other() -> None:
            seen["thread"] = idist.current()

        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert isinstance(seen["thread"], SerialContext)


def test_queries_never_communicate() -> None:
    ctx = idist.initialize("gloo")
    dist.destroy_process_group()  # the group is gone: a query that talked would fail
    assert (ctx.get_rank(), ctx.get_world_size(), ctx.rank, ctx.world_size) == (0, 1, 0, 1)
    assert idist.get_rank() == 0 and idist.get_world_size() == 1


def test_adopts_a_group_initialized_with_torch() -> None:
    store = dist.TCPStore("127.0.0.1", 0, 1, True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    ctx = idist.current()
    assert isinstance(ctx, NativeContext) and ctx.backend == "gloo"
    assert idist.current() is ctx  # cached while the group lives
    assert idist.all_reduce(torch.tensor([2.0])).tolist() == [2.0]
    assert idist.all_gather("a") == ["a"]
    idist.finalize()  # never destroys a group idist did not create
    assert dist.is_initialized()
    dist.destroy_process_group()
    assert isinstance(idist.current(), SerialContext)


def test_initialize_without_backend_and_launcher_is_serial() -> None:
    assert isinstance(idist.initialize(), SerialContext)


def test_support_probes_are_callable_and_truthful() -> None:
    assert idist.has_native_dist_support() is True and bool(idist.has_native_dist_support)
    for probe in (idist.has_hvd_support, idist.has_xla_support):
        assert bool(probe) == probe()
    assert "gloo" in idist.available_backends() and "serial" in idist.available_backends()


def test_one_rank_only_and_first_on_serial() -> None:
    calls: list[int] = []

    @idist.one_rank_only()
    def leader() -> int:
        calls.append(1)
        return 5

    assert leader() == 5 and calls == [1]
    with idist.one_rank_first():
        calls.append(2)
    assert calls == [1, 2]
    with pytest.raises(idist.CollectiveInputError, match=r"0\.\.0"), idist.one_rank_first(rank=3):
        pass


def test_show_config_logs_what_decided(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="idist")
    with idist.context("gloo"):
        idist.show_config()
    assert "backend: gloo" in caplog.text and "no launcher found" in caplog.text


def test_public_classes_are_final() -> None:
    for cls in (NativeContext, SerialContext):
        assert getattr(cls, "__final__", False), cls
    assert set(idist.__all__) <= set(dir(idist))


def test_group_ranks_must_be_ints() -> None:
    for bad in ([1.7], [True], ["0"]):
        with pytest.raises(idist.CollectiveInputError, match="ints"):
            idist.all_reduce(1, group=bad)
    assert idist.all_reduce(1, group=[0]) == 1
