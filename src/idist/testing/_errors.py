"""What a simulated or pooled world raises when a rank fails or a run overruns.

IdistError
├── RankFailedError    (RuntimeError)  a rank raised; ``rank`` names it, ``__cause__`` is its exception
└── WorldTimeoutError  (TimeoutError)  a run passed its timeout; ``unfinished`` names the ranks
"""

from __future__ import annotations

from collections.abc import Mapping

from .._errors import IdistError


def describe(exc: BaseException) -> str:
    """``Type: first line of the message``."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class RankFailedError(IdistError, RuntimeError):
    """A rank's function raised. ``rank`` is the rank whose own exception started the failure
    (the lowest, when every rank raised the same); that exception is ``__cause__`` (and
    ``exception``).

    ``failures`` maps every rank that failed in the run to its exception, in the order they
    were reported; besides ``rank``'s, they are usually its consequences (a peer waiting in a
    collective raises ``GroupBrokenError``, a follower ``LeaderFailedError``).
    """

    def __init__(self, rank: int, world_size: int, failures: Mapping[int, BaseException]) -> None:
        self.rank = rank
        self.world_size = world_size
        self.failures = dict(failures)
        self.exception = self.failures[rank]
        others = [r for r in self.failures if r != rank]
        tail = f" (then ranks {others} failed too)" if others else ""
        super().__init__(f"rank {rank} of {world_size} failed: {describe(self.exception)}{tail}")


class WorldTimeoutError(IdistError, TimeoutError):
    """A run did not finish within its timeout; ``unfinished`` lists the ranks still running."""

    def __init__(
        self, unfinished: tuple[int, ...], world_size: int, timeout: float, failures: Mapping[int, BaseException]
    ) -> None:
        self.unfinished = unfinished
        self.world_size = world_size
        self.timeout = timeout
        self.failures = dict(failures)
        failed = "".join(f"; rank {r} failed: {describe(e)}" for r, e in self.failures.items())
        super().__init__(
            f"ranks {list(unfinished)} of {world_size} did not finish within {timeout:g}s{failed}. "
            "Look for a collective that some ranks skip (e.g. under `if rank == 0:`) or a loop that never ends"
        )
