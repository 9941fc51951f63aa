"""Type tests for idist.testing (checked by mypy, never executed)."""

from __future__ import annotations

from typing import assert_type

import torch

from idist import DistContext, NativeContext
from idist.testing import ProcessWorld, Runner, SimulatedWorld, simulate


def rank_sum(ctx: DistContext, x: int) -> int:
    return ctx.all_reduce(x)


def native_only(ctx: NativeContext, t: torch.Tensor, scale: float) -> list[torch.Tensor]:
    return ctx.all_gather(t * scale)


assert_type(simulate(2, rank_sum, 1), list[int])
assert_type(simulate(2, native_only, torch.ones(1), 2.0), list[list[torch.Tensor]])
assert_type(SimulatedWorld(2).run(rank_sum, 3), list[int])
assert_type(ProcessWorld(2).run(rank_sum, 3), list[int])

runner: Runner = SimulatedWorld(3)
runner = ProcessWorld(3)
assert_type(runner.run(rank_sum, 1), list[int])

simulate(2, rank_sum, "one")  # type: ignore[arg-type]
simulate(2, rank_sum)  # type: ignore[arg-type]
ProcessWorld(2).run(native_only, torch.ones(1), 2.0)  # type: ignore[arg-type]
assert_type(simulate(2, rank_sum, 1, timeout=float("inf"), share_args=True), list[int])
assert_type(SimulatedWorld(2, share_args=True).run(rank_sum, 3), list[int])
simulate(2, rank_sum, 1, share_args="yes")  # type: ignore[arg-type]
