"""Run code on one rank: ``one_rank_only`` (decorator) and ``one_rank_first`` (block).

The module-level forms resolve the context when the decorated function is *called*, not
when it is decorated, since decorators usually run at import, before ``initialize()``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from ._errors import CollectiveInputError

if TYPE_CHECKING:
    from ._context import DistContext

F = TypeVar("F", bound=Callable[..., Any])


def _resolve(ctx: DistContext | None) -> DistContext:
    if ctx is not None:
        return ctx
    from ._stack import current

    return current()


def _check(ctx: DistContext, rank: int, local: bool) -> None:
    limit = ctx.nproc_per_node if local else ctx.world_size
    if not isinstance(rank, int) or not 0 <= rank < limit:
        what = "local rank" if local else "rank"
        raise CollectiveInputError(f"{what} must be in 0..{limit - 1}, got {rank!r}")


def one_rank_only(ctx: DistContext | None, rank: int = 0, with_barrier: bool = True) -> Callable[[F], F]:
    def decorator(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            c = _resolve(ctx)
            _check(c, rank, local=False)
            result = fn(*args, **kwargs) if c.rank == rank else None
            if with_barrier:
                c.barrier()
            return result

        return wrapper  # type: ignore[return-value]

    return decorator


@contextmanager
def one_rank_first(ctx: DistContext | None, rank: int = 0, local: bool = False) -> Iterator[None]:
    c = _resolve(ctx)
    _check(c, rank, local)
    leader = (c.local_rank if local else c.rank) == rank
    if not leader:
        c.barrier()
    yield
    if leader:
        c.barrier()
