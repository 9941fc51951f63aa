"""Never hang, never lie: checked collectives, stall reports and section timeouts.

A ``Guard`` watches one context's collectives through its rendezvous store, a side
channel gloo's own failures cannot abort: checked mode compares every rank's call before
data moves (``CollectiveMismatchError`` with a per-rank table); stall reports name the
ranks that did not arrive when the backend fails; ``with ctx.timeout(s):`` bounds each
collective of a block. See docs/design.md, "Checked mode and failures".
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

import attrs
import torch
from torch._C._distributed_c10d import Store

from ..._errors import (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    IdistError,
    PeerLostError,
)

#: how long a failing rank waits for its peers' stall reports
STALL_GRACE = 3.0
_COMPARED = ("call", "op", "data", "src", "group")


class GuardedComm(Protocol):
    @property
    def ranks(self) -> tuple[int, ...]: ...
    @property
    def group_rank(self) -> int: ...

    key: str
    seq: int
    check_seq: int


def checked_from_env() -> bool:
    return os.environ.get("IDIST_CHECKED", "").lower() in ("1", "true", "yes", "on")


def call_site() -> str:
    """``file:line`` of the first frame outside idist (the user's call)."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("idist."):
        frame = frame.f_back
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


@attrs.define(eq=False)
class Guard:
    store: Store | None
    default_timeout: datetime.timedelta
    checked: bool = False
    sections: list[datetime.timedelta] = attrs.Factory(list)

    @property
    def timeout(self) -> datetime.timedelta:
        return self.sections[-1] if self.sections else self.default_timeout

    @contextmanager
    def section(self, seconds: float) -> Iterator[None]:
        if not seconds > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {seconds!r}")
        self.sections.append(datetime.timedelta(seconds=seconds))
        try:
            yield
        finally:
            self.sections.pop()

    # ------------------------------------------------------------ checked mode
    def check(self, comm: GuardedComm, fingerprint: dict[str, str]) -> None:
        """Publish this rank's fingerprint, read the peers', raise on any difference."""
        store = self.store
        if store is None:
            return
        seq = comm.check_seq
        comm.check_seq += 1
        prefix = f"idist/chk/{comm.key}/"
        n = len(comm.ranks)
        fingerprint = dict(fingerprint, seq=str(seq))
        store.set(f"{prefix}{seq}/{comm.group_rank}", json.dumps(fingerprint))
        keys = [f"{prefix}{seq}/{r}" for r in range(n)]
        present = self._wait(keys, self.timeout.total_seconds())
        if not all(present):
            missing = [comm.ranks[r] for r, ok in enumerate(present) if not ok]
            raise CollectiveTimeoutError(
                f"{fingerprint['call']} #{seq} at {fingerprint['site']}: ranks {missing} did not reach a "
                f"collective within {self.timeout.total_seconds():g}s (they are stuck, dead, or on another "
                "code path); the group is no longer usable: finalize and restart"
            )
        prints = [json.loads(raw) for raw in store.multi_get(keys)]
        if seq >= 2:  # every rank has finished reading seq-2 once all wrote seq-1
            store.delete_key(f"{prefix}{seq - 2}/{comm.group_rank}")
        if any(any(p.get(f) != prints[0].get(f) for f in _COMPARED) for p in prints):
            raise CollectiveMismatchError(f"collective #{seq} differs between ranks:\n" + _table(comm.ranks, prints))

    def _wait(self, keys: list[str], seconds: float) -> list[bool]:
        """Block until every key exists (the store notifies, no polling); else say which do."""
        store = self.store
        assert store is not None
        try:
            store.wait(keys, datetime.timedelta(seconds=seconds))
        except RuntimeError:  # DistStoreError on timeout
            return [store.check([k]) for k in keys]
        return [True] * len(keys)

    # ----------------------------------------------------------- stall reports
    def failure(self, comm: GuardedComm, exc: BaseException, what: str) -> IdistError:
        """Map a backend failure to a typed error naming the ranks that did not arrive."""
        msg = str(exc)
        missing: list[int] | None = None
        if self.store is not None:
            key = f"idist/stall/{comm.key}/{comm.seq}/"
            try:
                self.store.set(f"{key}{comm.group_rank}", "1")
                grace = min(STALL_GRACE, self.timeout.total_seconds())
                present = self._wait([f"{key}{r}" for r in range(len(comm.ranks))], grace)
                missing = [comm.ranks[r] for r, ok in enumerate(present) if not ok]
            except Exception:  # noqa: S110 - the store may be gone with the rank that hosted it
                pass
        who = f"ranks {missing} did not arrive" if missing else "no rank is known to be missing"
        detail = f"{what} on group {list(comm.ranks)} failed: {who}. Backend said: {msg.splitlines()[0][:300]}"
        advice = "; the group is no longer usable: finalize and restart"
        lowered = msg.lower()
        if "timed out" in lowered or "timeout" in lowered:
            return CollectiveTimeoutError(detail + advice)
        return PeerLostError(detail + advice)


def fingerprint(call: str, op: str = "", data: str = "", src: str = "", group: Sequence[int] = ()) -> dict[str, str]:
    return {"call": call, "op": op, "data": data, "src": src, "group": ",".join(map(str, group)), "site": call_site()}


def describe(x: object, *, shape: bool) -> str:
    """What a checked collective compares about a value (shape only where it must match)."""
    if isinstance(x, torch.Tensor):
        return f"tensor {x.dtype} {tuple(x.shape)}" if shape else f"tensor {x.dtype}"
    return type(x).__name__ if shape else "value"


def _table(ranks: Sequence[int], prints: list[dict[str, str]]) -> str:
    cols = ("call", "op", "data", "src", "group", "site")
    rows = [("rank", *cols)] + [(str(r), *(p.get(c, "") for c in cols)) for r, p in zip(ranks, prints, strict=True)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols) + 1)]
    return "\n".join("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)
