"""Bad input raises the same typed error on every rank, and the group stays usable."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

import idist
from multiproc import run_ranks


def _catch(fn: Callable[[], object]) -> tuple[str, str]:
    try:
        fn()
    except idist.IdistError as exc:
        return type(exc).__name__, str(exc)
    return "no error", ""


def _bad_inputs(rank: int) -> dict[str, Any]:
    ctx = idist.initialize("gloo", timeout=30)
    out: dict[str, Any] = {}
    lock = threading.Lock()
    try:
        out["unknown_op"] = _catch(lambda: ctx.all_reduce(torch.ones(1), "MEAN"))  # type: ignore[call-overload]
        out["int_tensor_average"] = _catch(lambda: ctx.all_reduce(torch.ones(1, dtype=torch.int64), "AVERAGE"))
        out["float_and"] = _catch(lambda: ctx.all_reduce(1.5, "AND"))
        out["bad_src"] = _catch(lambda: ctx.broadcast(1, src=5))
        out["bad_group"] = _catch(lambda: ctx.all_reduce(1, group=[0, 7]))
        out["dtype_mismatch"] = _catch(
            lambda: ctx.all_gather(torch.ones(2, dtype=torch.float64 if rank == 0 else torch.float32))
        )
        out["unpicklable_on_one_rank"] = _catch(lambda: ctx.all_gather(lock if rank == 1 else "fine"))
        out["overflow"] = _catch(lambda: ctx.all_reduce(2**62, "SUM"))
        out["input_outside_int64"] = _catch(lambda: ctx.all_reduce(2**70 if rank == 1 else 1))
        out["mixed_types"] = _catch(lambda: ctx.all_reduce(True if rank == 0 else 1))  # a bool mixes with nothing
        out["unsupported_reduce_type"] = _catch(lambda: ctx.all_reduce("text" if rank == 0 else 1))  # type: ignore[call-overload]
        out["bcast_unpicklable_src"] = _catch(lambda: ctx.broadcast(lock if rank == 0 else None))
        out["still_works"] = ctx.all_reduce(rank + 1)
        out["initialize_twice"] = _catch(lambda: idist.initialize("gloo"))
    finally:
        idist.finalize()
    out["after_finalize"] = _catch(lambda: ctx.all_reduce(1))
    idist.finalize()  # safe twice
    out["closed"] = ctx.closed
    return out


def test_bad_input_raises_the_same_typed_error_on_every_rank() -> None:
    results = run_ranks(_bad_inputs, 2, timeout=120)
    expected = {
        "unknown_op": "UnsupportedOpError",
        "int_tensor_average": "UnsupportedOpError",
        "float_and": "UnsupportedOpError",
        "bad_src": "CollectiveInputError",
        "bad_group": "CollectiveInputError",
        "dtype_mismatch": "CollectiveInputError",
        "unpicklable_on_one_rank": "UnsupportedValueError",
        "overflow": "ReduceOverflowError",
        "input_outside_int64": "ReduceOverflowError",
        "mixed_types": "UnsupportedValueError",
        "unsupported_reduce_type": "UnsupportedValueError",
        "bcast_unpicklable_src": "UnsupportedValueError",
        "initialize_twice": "AlreadyInitializedError",
        "after_finalize": "ContextClosedError",
    }
    for key, cls in expected.items():
        names = [r[key][0] for r in results]
        assert names == [cls, cls], f"{key}: {names}"
    # the message names what to do / which rank
    r0 = results[0]
    assert "valid ops" in r0["unknown_op"][1] and "SUM" in r0["unknown_op"][1]
    assert "0..1" in r0["bad_src"][1]
    assert "rank 1" in r0["unpicklable_on_one_rank"][1]
    assert "rank 1" in r0["input_outside_int64"][1]
    assert "float32" in r0["dtype_mismatch"][1] and "float64" in r0["dtype_mismatch"][1]
    assert "finalized" in r0["after_finalize"][1]
    assert [r["still_works"] for r in results] == [3, 3]
    assert all(r["closed"] for r in results)


def test_errors_subclass_the_builtins_users_catch() -> None:
    assert issubclass(idist.UnknownBackendError, ValueError)
    assert issubclass(idist.BackendUnavailableError, ImportError)
    assert issubclass(idist.UnsupportedOpError, ValueError)
    assert issubclass(idist.UnsupportedValueError, TypeError)
    assert issubclass(idist.ReduceOverflowError, OverflowError)
    for cls in (idist.CollectiveInputError, idist.ContextClosedError, idist.UnsupportedValueError):
        assert issubclass(cls, idist.IdistError)
        assert pickle.loads(pickle.dumps(cls("m"))).args == ("m",)


def test_unknown_backend_lists_the_available_ones() -> None:
    with pytest.raises(idist.UnknownBackendError, match=r"'glo'.*available here: serial, gloo"):
        idist.initialize("glo")  # type: ignore[call-overload]


def test_nccl_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(idist.BackendUnavailableError, match="needs CUDA"):
        idist.initialize("nccl")


def _partial_env(rank: int) -> str:
    return _catch(lambda: idist.initialize())[0] + ":" + _catch(lambda: idist.initialize("gloo"))[1]


def test_partial_environment_raises_on_every_rank() -> None:
    results = run_ranks(_partial_env, 2, set_launcher_env=False, env={"RANK": "0", "WORLD_SIZE": "2"})
    for r in results:
        assert r.startswith("LaunchEnvironmentError:")
        assert "MASTER_ADDR, MASTER_PORT missing" in r
