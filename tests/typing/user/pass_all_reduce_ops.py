"""#35 item 3, accepted: each value type with its own ops."""

from __future__ import annotations

from typing import reveal_type

import torch

import idist


def flags(ctx: idist.DistContext) -> tuple[bool, int, float, float]:
    anyone = ctx.all_reduce(ctx.rank == 0, "OR")
    reveal_type(anyone)  # revealed: bool
    count = ctx.all_reduce(int(ctx.rank == 0))  # count the True values as ints
    reveal_type(count)  # revealed: int
    mean = ctx.all_reduce(float(ctx.rank), "AVERAGE")
    reveal_type(mean)  # revealed: float
    largest = idist.all_reduce(1.5, op="MAX")
    reveal_type(largest)  # revealed: float
    return anyone, count, mean, largest


def op_in_a_variable(ctx: idist.DistContext, op: idist.FloatReduceOp, any_op: idist.ReduceOp) -> None:
    reveal_type(ctx.all_reduce(1.5, op))  # revealed: float
    reveal_type(ctx.all_reduce(torch.ones(1), any_op))  # revealed: Tensor


def tensors(ctx: idist.DistContext, t: torch.Tensor) -> torch.Tensor:
    reveal_type(ctx.all_reduce(t.float(), "AVERAGE"))  # revealed: Tensor
    return ctx.all_reduce(t, "AND")  # a tensor's dtype decides when it runs
