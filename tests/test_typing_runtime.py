"""What the programs of the user-side typing suite (tests/typing/user) do when they run.

tests/test_typing_user.py shows that the type checkers refuse each ``reject_*`` program and
accept each ``pass_*`` one; here the same functions run on 2 simulated ranks (or in this
process, for setup and launch calls), showing that each refused call really fails and
each accepted one works. Calls that fail only on Horovod or XLA (``no_sync``, FSDP, their
optimizer options) are left to those lanes; ``spawn`` with arguments that do not fit ``fn``
would start processes, so ``Parallel.run`` shows the same check in place.
"""

from __future__ import annotations

import importlib.util
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

import idist
from idist.testing import simulate

USER = Path(__file__).parent / "typing" / "user"


def program(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"typing_user_{name}", USER / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outcomes(fn: Callable[[idist.DistContext], object]) -> list[str]:
    """What ``fn`` does on each of 2 simulated ranks: ``"ok"`` or the name of the exception it raised."""

    def one(ctx: idist.NativeContext) -> str:
        try:
            fn(ctx)
        except Exception as exc:
            return type(exc).__name__
        return "ok"

    return simulate(2, one, timeout=60)


@pytest.fixture(autouse=True)
def _no_default_context() -> None:
    idist.finalize()


def test_one_rank_only_gives_none_to_the_others() -> None:
    rejected, accepted = program("reject_one_rank_only"), program("pass_one_rank_only")
    assert outcomes(rejected.answer) == ["ok", "TypeError"]  # None + 1 on rank 1
    assert outcomes(rejected.answer_on) == ["TypeError", "ok"]
    assert simulate(2, accepted.answer) == [42, None]


def test_broadcast_gives_none_and_new_tensors_where_the_types_say() -> None:
    rejected, accepted = program("reject_broadcast"), program("pass_broadcast")
    assert outcomes(rejected.shout) == ["AttributeError", "AttributeError"]  # src passed None
    assert outcomes(rejected.outside) == ["ok", "AttributeError"]  # rank 1 is outside the group
    assert outcomes(rejected.into_parameter) == ["ok", "TypeError"]  # a plain Tensor is no Parameter
    assert simulate(2, accepted.shout) == ["HI", "HI"]
    assert simulate(2, accepted.placeholder) == ["HI", "HI"]
    assert simulate(2, accepted.receiver) == [{"lr": 0.1}, {"lr": 0.1}]
    weights = simulate(2, lambda ctx: accepted.into_parameter(ctx).weight.detach())
    assert torch.equal(weights[0], weights[1])


def test_all_reduce_refuses_the_ops_its_overloads_leave_out() -> None:
    rejected, accepted = program("reject_all_reduce_ops"), program("pass_all_reduce_ops")
    for fn in (rejected.count_true, rejected.product_of_flags, rejected.float_and):
        assert outcomes(fn) == ["UnsupportedOpError", "UnsupportedOpError"], fn.__name__
    # the types refuse AVERAGE of an int literal; the runtime takes it as a float variable's (#33)
    assert outcomes(rejected.int_average) == outcomes(lambda ctx: rejected.module_int_average()) == ["ok", "ok"]
    assert simulate(2, accepted.flags) == [(True, 1, 0.5, 1.5), (True, 1, 0.5, 1.5)]
    t = torch.tensor([True, False])
    assert simulate(2, lambda ctx: accepted.tensors(ctx, t.clone()).tolist()) == [[True, False], [True, False]]


def test_an_int_in_a_float_variable_reduces_as_a_float() -> None:
    accepted = program("pass_int_in_float")
    got = simulate(2, accepted.mean_loss)  # 0 on rank 0, 1.5 on rank 1
    assert got == [0.75, 0.75] and all(type(v) is float for v in got)


def test_an_average_of_ints_declared_float_is_a_float() -> None:
    got = simulate(2, program("pass_int_in_float").average_of_ints)  # 1 on rank 0, 0 on rank 1
    assert got == [0.5, 0.5] and all(type(v) is float for v in got)


def test_setup_without_a_backend_refuses_options() -> None:
    rejected, accepted = program("reject_setup_options"), program("pass_setup")
    for call in (
        rejected.checked_without_backend,
        rejected.timeout_without_backend,
        lambda: rejected.timeout_with_a_str("serial"),
        rejected.serial_takes_none,
    ):
        with pytest.raises(TypeError, match="takes no options"):
            call()
        idist.finalize()
    assert accepted.in_a_str("serial") == "serial"


def test_group_refuses_what_its_type_leaves_out() -> None:
    rejected, accepted = program("reject_group"), program("pass_group")
    assert outcomes(rejected.from_bytes) == ["CollectiveInputError", "CollectiveInputError"]
    assert outcomes(rejected.from_deque) == ["CollectiveInputError", "CollectiveInputError"]
    assert outcomes(lambda ctx: rejected.from_a_sequence(ctx, deque([0, 1]))) == [
        "CollectiveInputError",
        "CollectiveInputError",
    ]
    assert outcomes(lambda ctx: accepted.groups(ctx, deque([0, 1]))) == ["ok", "ok"]


def test_parallel_checks_what_its_types_check() -> None:
    rejected, accepted = program("reject_launch"), program("pass_launch")
    with pytest.raises(TypeError, match="scale"):
        rejected.parallel_missing_arg()
    with pytest.raises(TypeError):
        rejected.parallel_wrong_arg()
    with pytest.raises(idist.UnknownBackendError):
        rejected.parallel_typo()
    with pytest.raises(idist.LaunchConfigError, match="serial"):
        rejected.parallel_never_spawns_serial()
    with pytest.raises(idist.LaunchConfigError, match="join"):
        rejected.parallel_joins()
    with pytest.raises(idist.LaunchConfigError, match="mpirun"):
        rejected.spawn_mpi()
    with pytest.raises(idist.LaunchConfigError, match="join=False cannot be elastic"):
        rejected.spawn_elastic_handle()
    with pytest.raises(idist.LaunchConfigError, match="horovod"):
        rejected.spawn_elastic_horovod()
    assert idist.Parallel("serial").run(accepted.work, 2.0, offset=1.0) == [1.0]


def test_process_group_is_what_torch_takes() -> None:
    accepted = program("pass_backend_calls")
    assert outcomes(lambda ctx: accepted.process_group(ctx, nn.Linear(2, 2))) == ["ok", "ok"]


def test_the_docs_idioms() -> None:
    rejected, accepted = program("reject_docs_idioms"), program("pass_docs_idioms")
    # wrapped in DDP, the model is no longer the user's class
    assert outcomes(lambda ctx: rejected.wrap_in_place().head) == ["AttributeError", "AttributeError"]
    assert outcomes(lambda ctx: accepted.wrap(ctx).head) == ["ok", "ok"]


@pytest.mark.parametrize("numel", [4, 100_000], ids=["inline", "large"])
def test_a_parameter_receives_a_broadcast_in_place(numel: int) -> None:
    """What the accepted broadcast program relies on: a Parameter of src's shape is filled in place,
    also when it requires grad and the data came inline (a small tensor), as torch.distributed's is."""

    def receive(ctx: idist.NativeContext) -> tuple[bool, float]:
        p = nn.Parameter(torch.full((numel,), float(ctx.rank)))
        got = ctx.broadcast(p, src=0)
        return got is p and p.requires_grad, float(p.sum())

    assert simulate(2, receive) == [(True, 0.0), (True, 0.0)]


def test_set_local_rank_refuses_a_bool() -> None:
    with pytest.raises(idist.LaunchConfigError):
        program("reject_setup_options").local_rank_flag()


def test_the_typed_names_are_the_runtimes() -> None:
    """The Literal types the overloads use list what the runtime takes: its op tables, its backends."""
    from typing import get_args

    from idist import _backends, _reduce, _types
    from idist.launch import _plan

    assert get_args(_types.FloatReduceOp) == _reduce.FLOAT_OPS
    assert get_args(_types.IntReduceOp) == _reduce.INT_OPS
    assert set(get_args(_types.BoolReduceOp)) == set(_reduce.BOOL_OPS)
    assert set(get_args(_types.BoolRefusedOp)) == set(_types.COMMON_OPS) - set(_reduce.BOOL_OPS)
    assert get_args(_types.BackendName) == tuple(_backends.BACKENDS)
    assert get_args(_types.SpawnedNative) == _plan.NATIVE_SPAWNABLE
    assert (*get_args(_types.HorovodBackend), *get_args(_types.XlaBackend)) == _plan.DRIVEN_SPAWNABLE
