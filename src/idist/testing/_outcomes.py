"""What the ranks of one run reported: results, failures, and the error a run raises.

Blame is deterministic: the rank reported is the first whose *own* exception failed it, never
one that failed because another did (a follower's ``LeaderFailedError``, a peer released by
the runner, a rank stopped after the run was over). When several ranks raised the same
exception (an input error every rank agreed on), the lowest of them is reported.
"""

from __future__ import annotations

import sys
from typing import Generic, NoReturn, TypeVar, cast

import attrs

from .._errors import LeaderFailedError
from ._errors import RankFailedError, WorldTimeoutError

R = TypeVar("R")


def _pytest_outcome(exc: BaseException) -> bool:
    """``pytest.skip()``, ``xfail()`` or ``exit()``: raised as they are, so a rank can skip its test."""
    pytest = sys.modules.get("pytest")
    kinds = (pytest.skip.Exception, pytest.xfail.Exception, pytest.exit.Exception) if pytest is not None else ()
    return isinstance(exc, kinds)


def is_consequence(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) came from another rank's failure or the runner."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, LeaderFailedError) or getattr(type(e), "consequence", False) is True:
            return True
        todo += [e.__cause__, e.__context__]
    return False


def _same(a: BaseException, b: BaseException) -> bool:
    return type(a) is type(b) and str(a) == str(b)


@attrs.define
class Outcomes(Generic[R]):
    """Collects one report per rank; shared by the thread, process and XLA runners."""

    world_size: int
    results: dict[int, R] = attrs.Factory(dict)
    #: in the order they were reported
    failures: dict[int, BaseException] = attrs.Factory(dict)

    def add(self, rank: int, ok: bool, value: object) -> None:
        if ok:
            self.results[rank] = cast(R, value)  # the runner's fn returned it
        else:
            self.failures[rank] = value if isinstance(value, BaseException) else RuntimeError(repr(value))

    @property
    def unfinished(self) -> tuple[int, ...]:
        return tuple(r for r in range(self.world_size) if r not in self.results and r not in self.failures)

    def origin(self) -> int:
        """The rank to blame (see the module docstring); there must be a failure."""
        own = [r for r, e in self.failures.items() if not is_consequence(e)]
        if not own:
            return next(iter(self.failures))
        first = self.failures[own[0]]
        return min(r for r in own if _same(self.failures[r], first))

    def timeout_error(self, timeout: float) -> WorldTimeoutError:
        return WorldTimeoutError(self.unfinished, self.world_size, timeout, self.failures)

    def raise_first_failure(self) -> None:
        """``RankFailedError`` for the rank to blame, chained to its exception (a pytest skip,
        xfail or exit in that rank is raised as it is)."""
        if self.failures:
            self._raise(self.origin())

    def _raise(self, rank: int) -> NoReturn:
        exc = self.failures[rank]
        if _pytest_outcome(exc):
            raise exc
        raise RankFailedError(rank, self.world_size, self.failures) from exc

    def in_rank_order(self) -> list[R]:
        return [self.results[r] for r in range(self.world_size)]
