"""#35 item 3: ``all_reduce`` of a Python value admits only the ops the runtime takes for its type."""

from __future__ import annotations

import idist


def count_true(ctx: idist.DistContext) -> None:
    # rejected: mypy[deprecated] pyright[reportDeprecated]
    ctx.all_reduce(ctx.rank == 0)


def product_of_flags(ctx: idist.DistContext) -> None:
    # rejected: mypy[deprecated] pyright[reportDeprecated]
    idist.all_reduce(True, "PRODUCT")


def int_average(ctx: idist.DistContext) -> None:
    # rejected: mypy[call-overload] pyright[reportCallIssue,reportArgumentType]
    ctx.all_reduce(3, "AVERAGE")


def float_and(ctx: idist.DistContext) -> None:
    # rejected: mypy[call-overload] pyright[reportCallIssue,reportArgumentType]
    ctx.all_reduce(1.5, "AND")


def a_tensor_op_for_a_float(ctx: idist.DistContext, op: idist.ReduceOp) -> None:
    # rejected: mypy[arg-type] pyright[reportCallIssue,reportArgumentType]
    ctx.all_reduce(1.5, op)


def module_int_average() -> None:
    # rejected: mypy[call-overload] pyright[reportCallIssue,reportArgumentType]
    idist.all_reduce(3, op="AVERAGE")
