"""The lock-step state of a group (``LockStep``: slot, number-sum mode, broadcast guesses,
collective and agreement counters) is equal on every rank after every call, whatever the call
did: moved data, took the slow path, or raised on every rank or on one."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable

import pytest
import torch

import idist
from idist._exchange import LockStep
from idist.testing import simulate

BIG = 1 << 15  # float32 elements: larger than a broadcast frame carries inline

Call = Callable[[idist.DistContext], object]


def _calls(world_size: int, checked: bool) -> list[tuple[str, Call]]:
    lock = threading.Lock()
    calls: list[tuple[str, Call]] = [
        ("int sum", lambda c: c.all_reduce(c.rank + 1)),
        ("int sum again", lambda c: c.all_reduce(c.rank + 1)),
        ("float sum", lambda c: c.all_reduce(0.5 * c.rank)),
        ("big int sum", lambda c: c.all_reduce(2**50 + c.rank)),
        ("int and float: reduced as floats", lambda c: c.all_reduce(1 if c.rank == 0 else 1.5)),
        ("bool and int: raises everywhere", lambda c: c.all_reduce(True if c.rank == 0 else 1)),
        ("overflow on one rank: raises everywhere", lambda c: c.all_reduce(2**70 if c.rank == 1 else 1)),
        ("long strings grow the slot", lambda c: c.all_gather("x" * (300 * c.rank))),
        ("short strings", lambda c: c.all_gather(str(c.rank))),
        ("unpicklable on one rank: raises everywhere", lambda c: c.all_gather(lock if c.rank == 1 else "ok")),
        ("big broadcast", lambda c: c.broadcast(torch.ones(BIG) if c.rank == 0 else None, src=0)),
        ("big broadcast, guessed", lambda c: c.broadcast(torch.ones(BIG) if c.rank == 0 else None, src=0)),
        ("big broadcast, other shape", lambda c: c.broadcast(torch.ones(BIG + 1) if c.rank == 0 else None, src=0)),
        ("broadcast of a str", lambda c: c.broadcast("hi" if c.rank == 1 else None, src=1)),
        ("unpicklable src: raises everywhere", lambda c: c.broadcast(lock if c.rank == 0 else None, src=0)),
        ("bad src everywhere: agreed", lambda c: c.broadcast(1.0, src=7)),
        ("subgroup sum", lambda c: c.all_reduce(c.rank, group=[0, 1])),
        ("tensor sum", lambda c: c.all_reduce(torch.ones(3))),
        ("ragged gather", lambda c: c.all_gather(torch.ones(c.rank + 1))),
        ("barrier", lambda c: c.barrier()),
    ]
    if checked:  # unchecked, one rank's bad input breaks the group (tests/test_faults.py)
        calls += [
            ("bad src on one rank", lambda c: c.broadcast(1.0, src=7 if c.rank == 1 else 0)),
            ("unknown op on one rank", lambda c: c.all_reduce(1, "FOO" if c.rank == 0 else "SUM")),  # type: ignore[call-overload]
            ("after them", lambda c: c.all_reduce(c.rank)),
        ]
    return calls


def _states(ctx: idist.DistContext) -> dict[str, LockStep]:
    comms = {"world": ctx._state.world}
    sub = ctx._state.comms.get((0, 1))
    if sub is not None:
        comms["group 0,1"] = sub
    return {name: copy.deepcopy(comm.lockstep) for name, comm in comms.items()}


def _sequence(ctx: idist.DistContext, checked: bool) -> list[tuple[str, str, dict[str, LockStep]]]:
    out = []
    for name, call in _calls(ctx.world_size, checked):
        try:
            call(ctx)
            outcome = "ok"
        except idist.IdistError as exc:
            outcome = type(exc).__name__
        out.append((name, outcome, _states(ctx)))
    return out


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("checked", [False, True], ids=["unchecked", "checked"])
def test_every_ranks_lockstep_state_is_equal_after_every_call(world_size: int, checked: bool) -> None:
    runs = simulate(world_size, _sequence, checked, checked=checked, timeout=60)
    for step, first in enumerate(runs[0]):
        name, outcome, states = first
        for rank, run in enumerate(runs[1:], start=1):
            other_name, other_outcome, other_states = run[step]
            assert (other_name, other_outcome) == (name, outcome), f"rank {rank} at {name!r}"
            for comm, state in other_states.items():
                assert state == states[comm], f"{name!r}: {comm} of rank {rank} is {state}, rank 0's {states[comm]}"
    outcomes = {name: outcome for name, outcome, _ in runs[0]}
    assert outcomes["bool and int: raises everywhere"] == "UnsupportedValueError"
    assert outcomes["bad src everywhere: agreed"] == "CollectiveInputError"
    assert outcomes["big broadcast, guessed"] == "ok"
    world = {name: states["world"] for name, _, states in runs[0]}  # the state did move
    assert world["long strings grow the slot"].slot > 64
    assert world["big broadcast, guessed"].guesses[0][1] and not world["big broadcast, other shape"].guesses[0][1]
    assert world["barrier"].seq > len(world) and world["barrier"].agreed == (0 if checked else 1)
