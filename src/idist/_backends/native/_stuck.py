"""A main thread blocked in torch's own collectives (DDP, FSDP, checkpoints) when a peer is lost.

Such a thread never asks the watcher about its peers, and gloo cannot be woken from Python.
The watcher looks at it every interval, on its own thread, which makes no store request: when
a peer is lost (or the store stopped answering) and the main thread has stayed on one line of
torch.distributed / autograd for ``SETTLE`` seconds, it prints that thread's stack and ends the
process with status 1.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Protocol

import attrs

from ..._exit import remove_torch_temp_files
from ..._topology import Topology

#: where torch's own collectives wait (DDP's gradient all_reduce runs inside backward)
_TORCH_WAITS = tuple(os.path.join("torch", d, "") for d in ("distributed", "autograd", os.path.join("nn", "parallel")))


class _Lost(Protocol):
    @property
    def ranks(self) -> tuple[int, ...]: ...
    @property
    def why(self) -> str: ...


class Watched(Protocol):
    """What ``Stuck`` asks: the topology (this rank, the world's size) and which ranks are lost."""

    @property
    def topology(self) -> Topology: ...
    def lost(self, ranks: Sequence[int]) -> _Lost | None: ...


@attrs.define
class Stuck:
    """Where the main thread was at the last look, and since when."""

    SETTLE = 2.0
    _at: tuple[object, int] | None = None
    _since: float = 0.0

    def look(self, watched: Watched) -> None:
        frame = sys._current_frames().get(threading.main_thread().ident or -1)
        where = (frame.f_code, frame.f_lineno) if frame is not None else None
        if frame is None or not any(d in frame.f_code.co_filename for d in _TORCH_WAITS):
            self._at = None
            return
        now = time.monotonic()
        if where != self._at:
            self._at, self._since = where, now
            return
        if now - self._since < self.SETTLE:
            return
        lost = watched.lost(range(watched.topology.world_size))
        if lost is None:
            return
        stack = "".join(traceback.format_stack(frame))
        rank = watched.topology.rank
        message = (
            f"Traceback of rank {rank}'s main thread (most recent call last):\n{stack}"
            f"idist.PeerLostError: ranks {list(lost.ranks)} stopped answering ({lost.why}) while rank "
            f"{rank} waits in torch's own collective above, which cannot be interrupted; the group is "
            "lost: exiting with status 1\n"
        )
        os.write(2, message.encode(errors="replace"))  # no stream lock: the main thread may hold it
        remove_torch_temp_files()
        os._exit(1)
