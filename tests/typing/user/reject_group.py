"""#35 item 7: ``group=`` takes a list, tuple or range of ranks, a Group or a backend's group."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import idist


def from_bytes(ctx: idist.DistContext) -> None:
    # rejected: mypy[call-overload] pyright[reportCallIssue,reportArgumentType]
    ctx.all_reduce(1, group=b"\x00\x01")


def from_deque(ctx: idist.DistContext) -> None:
    # rejected: mypy[arg-type] pyright[reportArgumentType]
    ctx.barrier(group=deque([0, 1]))


def from_a_sequence(ctx: idist.DistContext, ranks: Sequence[int]) -> None:
    # rejected: mypy[call-overload] pyright[reportCallIssue,reportArgumentType]
    ctx.all_gather("x", group=ranks)
