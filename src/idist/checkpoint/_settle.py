"""Every rank says what went wrong on it; if anything did, every rank raises the same error.

Each step of a save or load ends with ``settle``: one ``all_gather`` of a short text per rank
(a token, often empty, when the step went well). So a rank never returns while a peer
failed, and all ranks raise the same class with the same message, naming the ranks (and
nodes) that failed; else every rank gets every rank's token.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from torch.distributed.checkpoint.api import CheckpointException

from .._errors import (
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointPathError,
    CheckpointStateError,
    CheckpointUnsafeError,
)

if TYPE_CHECKING:
    from .._context import DistContext

#: the classes a failure keeps across ranks (by name); anything else becomes a CheckpointError
_CLASSES: dict[str, type[CheckpointError]] = {
    cls.__name__: cls
    for cls in (
        CheckpointError,
        CheckpointStateError,
        CheckpointMismatchError,
        CheckpointPathError,
        CheckpointNotFoundError,
        CheckpointUnsafeError,
    )
}
_SEP = "\x1f"

#: what ``settle`` accepts: a step's exception (torch's CheckpointException is a BaseException)
Failure = Exception | CheckpointException | None


def describe(error: Exception | CheckpointException) -> str:
    """One line; for torch's CheckpointException, each failed rank's own exception."""
    if isinstance(error, CheckpointException):
        parts = [
            f"torch.distributed.checkpoint on rank {rank}: {type(exc).__name__}: {exc}"
            for rank, (exc, _trace) in sorted(error.failures.items())
        ]
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
    kind = "" if error is None else type(error).__name__ if isinstance(error, CheckpointError) else "CheckpointError"
    mine = f"={token}" if error is None else f"{kind}{_SEP}{where(ctx)}{_SEP}{describe(error)}"
    seen: list[str] = ctx.all_gather(mine)
    failed = [s.split(_SEP, 2) for s in seen if not s.startswith("=")]
    if not failed:
        return [s[1:] for s in seen]
    cls = _CLASSES.get(failed[0][0], CheckpointError)
    messages = {msg for _, _, msg in failed}
    if ctx.world_size == 1:
        text = f"{what} failed: {messages.pop()}"
    elif len(messages) == 1:
        who = "every rank" if len(failed) == ctx.world_size else ", ".join(w for _, w, _ in failed)
        text = f"{what} failed on {who}: {messages.pop()}"
    else:
        text = f"{what} failed on {len(failed)} of {ctx.world_size} ranks:\n" + "\n".join(
            f"  {w}: {msg}" for _, w, msg in failed
        )
    text += changed
    if isinstance(error, BaseException):
        raise cls(text) from error
    raise cls(text)
