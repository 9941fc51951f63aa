"""One replica's XLA device: running programs now, in rank order where the CPU runtime needs it.

XLA's CPU runtime matches a collective across the device threads of one process by the
compiled module's id (pytorch/xla#9089: compiled twice, they wait forever for each other),
so in that *ordered* mode the threads compile each collective in rank order through a
turnstile (rank 0 compiles, the others hit torch_xla's compilation cache).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import attrs
import torch

from ..._errors import CollectiveTimeoutError
from . import _lib


@attrs.define(eq=False)
class _Turnstile:
    """Lets the device threads of one process compile a collective in rank order."""

    size: int
    turn: int = 0
    cond: threading.Condition = attrs.Factory(threading.Condition)

    def run(self, index: int, fn: Callable[[], None], timeout: float) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.turn == index, timeout):
                raise CollectiveTimeoutError(
                    f"XLA device thread {index} waited {timeout:.0f}s for rank {self.turn} to reach the same "
                    "collective; every rank must call the same collectives in the same order"
                )
            try:
                fn()
            finally:
                self.turn = (index + 1) % self.size
                self.cond.notify_all()


_TURNSTILES: dict[int, _Turnstile] = {}
_TURNSTILES_LOCK = threading.Lock()


def _turnstile(size: int) -> _Turnstile:
    with _TURNSTILES_LOCK:
        ts = _TURNSTILES.get(size)
        if ts is None:
            ts = _TURNSTILES[size] = _Turnstile(size)
        return ts


@attrs.frozen(eq=False, kw_only=True)
class XlaDevice:
    """The XLA device of replica ``rank`` of ``world_size``, and how its programs run."""

    device: torch.device
    rank: int
    world_size: int
    #: the device threads of this process must compile collectives in turn (CPU, several threads)
    ordered: bool
    #: seconds a device thread waits for its turn before raising
    turn_timeout: float

    def prepare(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on this device; in ordered mode its pending graph is run first."""
        dev = t if t.device == self.device else t.to(self.device)
        if self.ordered and dev is t:
            # Its own graph has no collective, so any thread may compile it as it likes;
            # afterwards the collective's program only sees device data.
            _lib.C._xla_sync_multi([dev], devices=[], wait=False)
        return dev

    def launch(self, tensors: list[torch.Tensor]) -> None:
        """Compile and start the pending programs computing ``tensors``."""
        self.in_turn(lambda: _lib.C._xla_sync_multi(tensors, devices=[], wait=False))
        # Every xm collective chains the device's all-reduce token; syncing ``tensors`` runs
        # the collective but leaves the token pending on it, so the next collective's program
        # would contain (and run again) every collective since the last torch_xla.sync(): a
        # new, ever larger program each call, never a compilation-cache hit. The collective
        # has run now, so start the next chain afresh, as torch_xla.sync() does.
        _lib.C._set_all_reduce_token(str(self.device), None)

    def in_turn(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (which compiles), in rank order when ordered."""
        if self.ordered:
            _turnstile(self.world_size).run(self.rank, fn, self.turn_timeout)
        else:
            fn()

    def materialize(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run the programs computing ``tensors`` now; their values on the CPU."""
        self.launch(tensors)
        return [t.cpu() for t in tensors]

    def world_sum(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Element-wise SUM over every replica of the world (CPU results)."""
        reduced: list[torch.Tensor] = []
        for t in tensors:
            out = _lib.xm.all_reduce("sum", self.prepare(t))
            assert isinstance(out, torch.Tensor)
            reduced.append(out)
        return self.materialize(reduced)
