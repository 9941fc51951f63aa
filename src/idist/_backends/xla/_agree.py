"""Before a tensor is reduced, its group agrees on the op, dtype and shape (XLA).

Ranks that reduce different shapes would compile different programs and wait for each other
forever, so each member announces a ``_codec.ReduceHeader`` (or the error it found) in one
byte exchange, which the bystanders join too: they learn what to reduce alongside.
"""

from __future__ import annotations

from ... import _codec, _exchange
from ..._errors import CollectiveInputError
from ..._frame import Frame
from ._comm import XlaComm


def announce(comm: XlaComm, frame: Frame) -> None:
    """A member's part: ``frame`` is its ``ReduceHeader`` or its error; raises on every rank when
    any rank sent an error or the headers differ."""
    heads = _exchange.decode_all(comm, _exchange.gather_frames(comm, frame), "all_reduce")
    if len(set(heads)) > 1:
        seen = {r: str(h) for r, h in zip(comm.ranks, heads, strict=True)}
        raise CollectiveInputError(
            f"all_reduce needs the same op, dtype and shape on every rank of the group, got {seen}; "
            "pass matching tensors"
        )


def listen(comm: XlaComm) -> _codec.ReduceHeader | None:
    """A bystander's part in the members' first exchange of an all_reduce: the header they all
    announced, or None when they exchanged Python values or will raise instead."""
    heads = [_codec.decode(b) for b in _exchange.gather_frames(comm, _codec.encode(None))]
    first = heads[0]
    if isinstance(first, _codec.ReduceHeader) and all(h == first for h in heads):
        return first
    return None
