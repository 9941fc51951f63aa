"""Tensor broadcast without waiting for the header: ranks predict src's shape and dtype.

A large tensor broadcast sends a header (src's shape and dtype) so that receivers may pass
``None`` or another shape; the data can only move once it arrived. A group that can run
two broadcasts back to back sends both at once when every rank can predict the data's
size: each remembers what src last broadcast on the group (all read the same header).

src sends its tensor when it has the predicted shape and dtype, else a scratch buffer of
that size; the header then tells every rank whether the data is src's. A wrong guess costs
one more round (and a receiver's tensor of the predicted shape may hold scratch bytes);
the guess is then not used until src broadcasts the same shape and dtype twice in a row.
"""

from __future__ import annotations

from typing import Protocol

import torch

from . import _exchange
from ._exchange import Guess
from ._frame import Frame, tensor_bytes
from ._inplace import plain, resolved

__all__ = ["Guess", "Pipeline", "fits", "guess", "remember", "send"]


class Pipeline(_exchange.Comm, Protocol):
    """A comm that can run a header broadcast and a data broadcast back to back (its guesses
    live in its ``lockstep``)."""

    def broadcast_pair(self, head: torch.Tensor, data: torch.Tensor, src: int) -> None:
        """Broadcast two CPU buffers from group rank ``src``, the second not waiting for the first."""
        ...


def guess(pipe: Pipeline, src: int) -> Guess | None:
    """The shape and dtype every rank expects from ``src`` now, or None to ask first."""
    entry = pipe.lockstep.guesses.get(src)
    return entry[0] if entry is not None and entry[1] else None


def remember(pipe: Pipeline, src: int, seen: Guess | None) -> None:
    """Note what ``src`` sent (None: not a large tensor): trusted at once, or once repeated after a miss."""
    guesses = pipe.lockstep.guesses
    if seen is None:
        guesses.pop(src, None)
        return
    last = guesses.get(src)
    guesses[src] = (seen, last is None or last[0] == seen)


def fits(t: torch.Tensor, expected: Guess) -> bool:
    return t.dtype == expected[1] and tuple(t.shape) == expected[0]


def send(
    pipe: Pipeline, frame: Frame | None, x: object, src: int, expected: Guess
) -> tuple[torch.Tensor, torch.Tensor]:
    """Broadcast src's header (``frame`` on src) and the expected data together.

    Returns the whole header frame and the tensor the data landed in: ``x`` itself when it
    has the expected shape and dtype (and, on a receiver, is contiguous CPU memory), else a
    new tensor. That tensor holds src's data only when the header says src has ``expected``.
    """
    head = _exchange.first_slot(pipe, frame)
    me = frame is not None
    if isinstance(x, torch.Tensor) and fits(x, expected) and (me or (x.is_cpu and x.is_contiguous() and plain(x))):
        data = x  # src's is only read (tensor_bytes copies what is not plain memory)
    else:
        data = torch.empty(expected[0], dtype=expected[1])
    pipe.broadcast_pair(head, tensor_bytes(resolved(data) if me else data), src)
    return _exchange.finish_broadcast(pipe, head, frame, src), data
