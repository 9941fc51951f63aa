"""What the ranks of one run reported: results, failures, and the error a run raises."""

from __future__ import annotations

from typing import Generic, TypeVar, cast

import attrs

from ._errors import RankFailedError, WorldTimeoutError

R = TypeVar("R")


@attrs.define
class Outcomes(Generic[R]):
    """Collects one report per rank; shared by the thread, process and XLA runners."""

    world_size: int
    results: dict[int, R] = attrs.Factory(dict)
    failures: dict[int, BaseException] = attrs.Factory(dict)

    def add(self, rank: int, ok: bool, value: object) -> None:
        if ok:
            self.results[rank] = cast(R, value)  # the runner's fn returned it
        else:
            self.failures[rank] = value if isinstance(value, BaseException) else RuntimeError(repr(value))

    @property
    def unfinished(self) -> tuple[int, ...]:
        return tuple(r for r in range(self.world_size) if r not in self.results and r not in self.failures)

    def timeout_error(self, timeout: float) -> WorldTimeoutError:
        return WorldTimeoutError(self.unfinished, self.world_size, timeout, self.failures)

    def raise_first_failure(self) -> None:
        """``RankFailedError`` for the first rank that reported a failure, chained to it."""
        if self.failures:
            rank = next(iter(self.failures))
            raise RankFailedError(rank, self.world_size, self.failures) from self.failures[rank]

    def in_rank_order(self) -> list[R]:
        return [self.results[r] for r in range(self.world_size)]
