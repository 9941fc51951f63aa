"""Every rank says what went wrong on it; if anything did, every rank raises the same error.

Each step of a save or load ends with ``settle``: one ``all_gather`` of a short status per
rank (a token, often empty, when the step went well; a digest of the failure otherwise,
``_reports``). So a rank never returns while a peer failed, and all ranks raise the same
class with the same message, naming the ranks (and nodes) that failed and showing the first
few messages, each cut to a bounded length; else every rank gets every rank's token.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from torch.distributed.checkpoint.api import CheckpointException

from .. import _reports
from .._errors import CheckpointError

if TYPE_CHECKING:
    from .._context import DistContext


def _family(cls: type[CheckpointError]) -> list[type[CheckpointError]]:
    """``cls`` and the classes below it that idist defines (a user's subclass is not one)."""
    below = [c for sub in cls.__subclasses__() if sub.__module__ == cls.__module__ for c in _family(sub)]
    return [cls, *below]


#: the classes a failure keeps across ranks (by name): every CheckpointError of idist's;
#: anything else becomes a CheckpointError
_CLASSES: dict[str, type[CheckpointError]] = {cls.__name__: cls for cls in _family(CheckpointError)}
#: what ``settle`` accepts: a step's exception (torch's CheckpointException is a BaseException)
Failure = Exception | CheckpointException | None


def describe(error: Exception | CheckpointException) -> str:
    """One line; for torch's CheckpointException, the first failed ranks' own exceptions, each cut."""
    if isinstance(error, CheckpointException):
        failures = sorted(error.failures.items())
        parts = [
            f"torch.distributed.checkpoint on rank {rank}: {_reports.cut(f'{type(exc).__name__}: {exc}')}"
            for rank, (exc, _trace) in failures[: _reports.RANKS]
        ]
        if len(failures) > _reports.RANKS:
            parts.append(f"and on {len(failures) - _reports.RANKS} more ranks")
        return "; ".join(parts) or "torch.distributed.checkpoint failed"
    if isinstance(error, CheckpointError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def where(ctx: DistContext) -> str:
    """This rank, and its node when there are several."""
    if ctx.nnodes > 1:
        return f"rank {ctx.rank} (node {ctx.node_rank}, {socket.gethostname()})"
    return f"rank {ctx.rank}"


def settle(ctx: DistContext, what: str, error: Failure, token: str = "", changed: str = "") -> list[str]:
    """Raise on every rank when ``error`` is set on any rank (``what`` names the step, ``changed``
    ends the message: what the failed step left changed); else every rank's ``token``, in rank order."""
    failure = None
    if error is not None:
        kind = type(error).__name__ if isinstance(error, CheckpointError) else "CheckpointError"
        failure = (kind, where(ctx), describe(error))
    outcome = _reports.exchange(ctx, token, failure)
    if not outcome.failed:
        return outcome.tokens
    cls = _CLASSES.get(outcome.failed[0].kind, CheckpointError)
    text = _reports.report(what, outcome.failed, ctx.world_size) + changed
    if isinstance(error, BaseException):
        raise cls(text) from error
    raise cls(text)
