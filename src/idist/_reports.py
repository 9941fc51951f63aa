"""Failure reports gathered from every rank, bounded whatever the world size and the messages.

A report shows at most ``MESSAGES`` distinct messages, each cut to ``LIMIT`` bytes, names
at most ``RANKS`` ranks for each and counts the rest. ``exchange`` costs a rank O(N) bytes
with a small constant: one all_gather of a short status per rank (a token, or a failure's
kind, place and a digest of its message), then, only when some rank failed, one all_reduce
of the shown messages, ``MESSAGES * LIMIT`` bytes whatever N is.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import torch

if TYPE_CHECKING:
    from ._context import DistContext

#: distinct messages a report shows
MESSAGES = 4
#: ranks a report names for one message (or one place) before it counts the rest
RANKS = 8
#: UTF-8 bytes a shown message keeps (its head and its end)
LIMIT = 1024
#: bytes of a failure's kind and of its place (``rank 3 (node 1, host)``) in the status
_SHORT = 160
_SEP = "\x1f"
_LENGTH = struct.Struct("<I")
#: one shown message in the all_reduce: its length, then its bytes (a multiple of 4: moved as int32)
_SLOT = _LENGTH.size + LIMIT


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "backslashreplace")


def cut(text: str, limit: int = LIMIT) -> str:
    """``text`` in at most ``limit`` UTF-8 bytes: its head and its end, saying how many bytes were left out."""
    data = _utf8(text)
    if len(data) <= limit:
        return text
    keep = max(limit - 48, 16)  # room for the note
    head, tail = keep * 3 // 4, keep - keep * 3 // 4
    note = f" [... {len(data) - head - tail} bytes left out ...] "
    return data[:head].decode("utf-8", "ignore") + note + data[len(data) - tail :].decode("utf-8", "ignore")


def first(items: Sequence[str], noun: str = "") -> str:
    """The first ``RANKS`` of ``items``, then how many more: ``"a, b and 3 more ranks"`` for noun ``" rank"``."""
    shown = ", ".join(items[:RANKS])
    rest = len(items) - RANKS
    if rest <= 0:
        return shown
    return f"{shown} and {rest} more{noun}{'s' if noun and rest > 1 else ''}"


def ranks(numbers: Sequence[int]) -> str:
    """``"rank 3"``, or ``"ranks 1, 2, ..., 8 and 5 more"``."""
    if len(numbers) == 1:
        return f"rank {numbers[0]}"
    return "ranks " + first([str(r) for r in numbers])


@attrs.frozen
class Failed:
    """The ranks that failed with one message, in rank order, and where each failed."""

    kind: str
    ranks: tuple[int, ...]
    wheres: tuple[str, ...]
    #: the message, cut to ``LIMIT`` bytes; None past the first ``MESSAGES`` messages
    text: str | None


@attrs.frozen
class Outcome:
    """Every rank's token ("" where a rank failed), and the failures by message, in order of first rank."""

    tokens: list[str]
    failed: list[Failed]


def exchange(ctx: DistContext, token: str = "", failure: tuple[str, str, str] | None = None) -> Outcome:
    """Every rank's ``token``, or its ``failure``: (kind, where, message); the same ``Outcome`` on every rank."""
    text = ""
    if failure is None:
        mine = "=" + token
    else:
        kind, where, message = failure
        text = cut(message)
        digest = hashlib.blake2b(_utf8(text), digest_size=8).hexdigest()
        mine = "!" + _SEP.join((cut(kind, _SHORT).replace(_SEP, " "), cut(where, _SHORT).replace(_SEP, " "), digest))
    seen: list[str] = ctx.all_gather(mine)
    tokens: list[str] = []
    groups: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for rank, status in enumerate(seen):
        if status.startswith("="):
            tokens.append(status[1:])
            continue
        tokens.append("")
        kind, where, digest = status[1:].split(_SEP)
        groups.setdefault((kind, digest), []).append((rank, where))
    if not groups:
        return Outcome(tokens, [])
    texts = _shown(ctx, [members[0][0] for members in list(groups.values())[:MESSAGES]], text)
    failed = [
        Failed(kind, tuple(r for r, _ in members), tuple(w for _, w in members), texts[i] if i < len(texts) else None)
        for i, ((kind, _), members) in enumerate(groups.items())
    ]
    return Outcome(tokens, failed)


def _shown(ctx: DistContext, senders: list[int], mine: str) -> list[str]:
    """The messages of ``senders`` (this rank's is ``mine``), moved by one all_reduce of a slot each."""
    buf = bytearray(len(senders) * _SLOT)
    if ctx.rank in senders:
        data = _utf8(mine)[:LIMIT]
        at = senders.index(ctx.rank) * _SLOT
        _LENGTH.pack_into(buf, at, len(data))
        buf[at + _LENGTH.size : at + _LENGTH.size + len(data)] = data
    # int32: every backend sums it exactly; each slot is one rank's bytes plus zeros from the others
    summed = ctx.all_reduce(torch.frombuffer(buf, dtype=torch.int32))
    out = bytes(summed.cpu().view(torch.uint8).tolist())
    texts = []
    for i in range(len(senders)):
        (length,) = _LENGTH.unpack_from(out, i * _SLOT)
        start = i * _SLOT + _LENGTH.size
        texts.append(out[start : start + min(length, LIMIT)].decode("utf-8", "replace"))
    return texts


def report(what: str, failed: list[Failed], world_size: int) -> str:
    """``what`` failed: on which ranks, with which messages (the first ``MESSAGES``), the rest counted."""
    total = sum(len(f.ranks) for f in failed)
    if world_size == 1:
        return f"{what} failed: {failed[0].text}"
    if len(failed) == 1:
        who = "every rank" if total == world_size else first(failed[0].wheres, " rank")
        return f"{what} failed on {who}: {failed[0].text}"
    lines = [f"  {first(f.wheres, ' rank')}: {f.text}" for f in failed[:MESSAGES]]
    hidden = failed[MESSAGES:]
    if hidden:
        count = sum(len(f.ranks) for f in hidden)
        lines.append(
            f"  and {count} more rank{'s' if count > 1 else ''}, with {len(hidden)} other "
            f"message{'s' if len(hidden) > 1 else ''}"
        )
    return f"{what} failed on {total} of {world_size} ranks:\n" + "\n".join(lines)
