"""Run code on one rank: ``one_rank_only`` (decorator) and ``one_rank_first`` (block).

Both are exception-safe: when the leading rank raises, its exception propagates there and
every follower raises ``LeaderFailedError`` (with the leader's message, cut to a bounded
length) instead of running the block or waiting forever. The leader's status travels in one
``all_gather`` that also serves as the barrier (its message in a second round: ``_reports``).

Both take a function that gives the context: the module-level forms resolve it when the
decorated function is *called*, since decorators usually run at import, before
``initialize()``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from . import _reports
from ._errors import CollectiveInputError, LeaderFailedError

if TYPE_CHECKING:
    from ._context import DistContext

P = ParamSpec("P")
R = TypeVar("R")


def _check(ctx: DistContext, rank: int, local: bool) -> None:
    limit = ctx.nproc_per_node if local else ctx.world_size
    if not isinstance(rank, int) or not 0 <= rank < limit:
        what = "local rank" if local else "rank"
        raise CollectiveInputError(f"{what} must be in 0..{limit - 1}, got {rank!r}")


def _exchange_status(ctx: DistContext, failure: str | None, what: str) -> None:
    """Everyone learns whether a leader failed; followers raise if one did."""
    outcome = _reports.exchange(ctx, failure=None if failure is None else ("", f"rank {ctx.rank}", failure))
    if failure is not None:
        return  # the leader re-raises its own exception
    if outcome.failed:
        leader = outcome.failed[0]
        raise LeaderFailedError(
            f"rank {leader.ranks[0]} raised inside {what}, so rank {ctx.rank} stops too: {leader.text}"
        )


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def one_rank_only(
    resolve: Callable[[], DistContext], rank: int = 0, with_barrier: bool = True
) -> Callable[[Callable[P, R]], Callable[P, R | None]]:
    """The decorator; ``resolve`` gives the context when the function is called. The other ranks
    get None, so the decorated function returns ``R | None``."""

    def decorator(fn: Callable[P, R]) -> Callable[P, R | None]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
            c = resolve()
            _check(c, rank, local=False)
            if c.rank != rank:
                if with_barrier:
                    _exchange_status(c, None, f"one_rank_only({fn.__qualname__})")
                return None
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                if with_barrier:
                    _exchange_status(c, _describe(exc), "one_rank_only")
                raise
            if with_barrier:
                _exchange_status(c, None, "one_rank_only")
            return result

        return wrapper

    return decorator


@contextmanager
def one_rank_first(resolve: Callable[[], DistContext], rank: int = 0, local: bool = False) -> Iterator[None]:
    c = resolve()
    _check(c, rank, local)
    leader = (c.local_rank if local else c.rank) == rank
    if not leader:
        _exchange_status(c, None, "one_rank_first")
        yield
        return
    try:
        yield
    except BaseException as exc:
        _exchange_status(c, _describe(exc), "one_rank_first")
        raise
    _exchange_status(c, None, "one_rank_first")
