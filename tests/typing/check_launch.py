"""Type tests for the launchers: checked by mypy (strict, warn_unused_ignores), never executed."""

from __future__ import annotations

from typing import assert_type

import idist
from idist import LaunchConfigError, LaunchError, Parallel, SpawnHandle


def work(local_rank: int, scale: float) -> float:
    return local_rank * scale


def torch_multiprocessing_form() -> None:
    """spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn")."""
    assert_type(idist.spawn(work, args=(2.0,), nprocs=2), list[float])
    assert_type(idist.spawn(fn=work, args=(2.0,), nprocs=2), list[float])
    assert_type(idist.spawn(work, (2.0,), 2), list[float])
    assert_type(idist.spawn(work, (2.0,), 2, True, False, "fork"), list[float])
    assert_type(idist.spawn(work, (2.0,), 2, False), SpawnHandle[float])
    assert_type(idist.spawn(work, args=(2.0,), nprocs=2, join=False), SpawnHandle[float])
    assert_type(idist.spawn(work, (1.0,), 2, nnodes=2, node_rank=1, master_port=29400), list[float])
    idist.spawn(work, (1.0,), 2, start_method="threads")  # type: ignore[call-overload]
    # elastic (torch's agent): joined only, nnodes an int or (MIN, MAX)
    assert_type(idist.spawn(work, (1.0,), 2, max_restarts=2), list[float])
    assert_type(idist.spawn(work, (1.0,), 2, nnodes=(1, 4), master_addr="10.0.0.1", master_port=29500), list[float])
    idist.spawn(work, (1.0,), 2, False, max_restarts=2)  # type: ignore[call-overload]
    idist.spawn(work, (1.0,), 2, nnodes=(1, 4), join=False)  # type: ignore[call-overload]
    idist.spawn(work, (1.0,), 2, nnodes=(1, 2, 4))  # type: ignore[arg-type]
    idist.spawn(work, (1.0,), nprocs="2")  # type: ignore[call-overload]


def ignite_form() -> None:
    """spawn(backend, fn, args, kwargs_dict=None, nproc_per_node=1, ...)."""
    assert_type(idist.spawn("gloo", work, (2.0,), nproc_per_node=2), list[float])
    assert_type(idist.spawn(backend="gloo", fn=work, args=(2.0,), nproc_per_node=2), list[float])
    assert_type(idist.spawn("gloo", work, (2.0,), None, 2, 1, 0, None, None, None), list[float])
    assert_type(idist.spawn("nccl", work, (2.0,), kwargs_dict={}, join=False), SpawnHandle[float])
    assert_type(idist.spawn("horovod", work, (2.0,), nproc_per_node=2), list[float])
    assert_type(idist.spawn("xla-tpu", work, (2.0,), nproc_per_node=2, timeout=60.0), list[float])
    idist.spawn("horovod", work, (2.0,), join=False)  # type: ignore[call-overload]
    assert_type(idist.spawn("gloo", work, (2.0,), nproc_per_node=2, nnodes=(1, 2), max_restarts=1), list[float])
    idist.spawn("gloo", work, (2.0,), nproc_per_node=2, max_restarts=1, join=False)  # type: ignore[call-overload]
    idist.spawn("xla-tpu", work, (2.0,), nproc_per_node=2, max_restarts=1)  # type: ignore[call-overload]
    idist.spawn("xla-tpu", work, (2.0,), join=False)  # type: ignore[call-overload]
    idist.spawn("serial", work, (2.0,))  # type: ignore[call-overload]


def neither_form() -> None:
    idist.spawn()  # type: ignore[call-overload]
    idist.spawn((2.0,), work)  # type: ignore[call-overload]
    idist.spawn(work, "gloo")  # type: ignore[call-overload]


def handle(h: SpawnHandle[float]) -> None:
    assert_type(h.join(timeout=1.0), bool)
    assert_type(h.results, list[float])
    h.terminate()
    with h as same:
        assert_type(same, SpawnHandle[float])


def parallel() -> None:
    with Parallel(backend="gloo", nproc_per_node=2) as p:
        assert_type(p, Parallel)
        assert_type(p.run(work, 2.0), list[float])
    assert_type(Parallel(nprocs=2).run(work, scale=1.0), list[float])
    Parallel("gloo", 2, start_method="fork", daemon=False, timeout=30.0, join=True)
    Parallel("gloo", 2, start_method="threads")  # type: ignore[call-overload]
    Parallel("gloo", 2, nnode=2)  # type: ignore[call-overload]
    assert_type(Parallel("gloo", 2, max_restarts=3).run(work, 1.0), list[float])
    Parallel("gloo", 2, nnodes=(1, 4), master_addr="10.0.0.1", master_port=29500, max_restarts=3)
    Parallel("horovod", 2, max_restarts=3)  # type: ignore[call-overload]


def errors(e: LaunchError, c: LaunchConfigError) -> None:
    assert_type(e.rank, int | None)
    assert_type(e.traceback, str | None)
    assert_type(e.signal_name, str | None)
    err: ValueError = c
    rt: RuntimeError = e
    del err, rt
