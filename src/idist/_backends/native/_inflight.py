"""Tensors a process group's worker threads still hold after a collective completed.

A gloo work object drops its tensors a moment *after* ``work.wait()`` returned; if that
lands in interpreter finalization the worker's GIL request aborts the process (SIGABRT).
Every tensor handed to a backend is held here with its reference count from before the
call and released once the count shows the backend let go: at the next collective, when
the context closes, and at exit. See docs/design.md, "Clean exit".
"""

from __future__ import annotations

import atexit
import ctypes
import time
import weakref

import attrs
import torch

from . import _workers

#: how long closing (or exiting) waits for worker threads to drop finished work
DRAIN_SECONDS = 5.0
#: how long it waits for the tensors of collectives that failed: their work is either
#: finished (let go at once) or stuck in the backend for good (waiting cannot help)
FAILED_SECONDS = 0.25


@attrs.define(eq=False)
class InFlight:
    """The tensors of one process group's recent collectives."""

    #: (tensor, its count before the call, whether the call failed)
    held: list[tuple[torch.Tensor, int, bool]] = attrs.Factory(list)

    def __attrs_post_init__(self) -> None:
        _LIVE.add(self)

    def before(self, tensors: tuple[torch.Tensor, ...]) -> list[int]:
        """Forget what the backend has let go of; the counts of ``tensors`` before the call."""
        if self.held:
            self.release()
        return [_count(t) for t in tensors]

    def after(self, tensors: tuple[torch.Tensor, ...], counts: list[int], failed: bool = False) -> None:
        self.held.extend((t, n, failed) for t, n in zip(tensors, counts, strict=True))

    def release(self) -> None:
        self.held = [entry for entry in self.held if _count(entry[0]) > entry[1]]

    def drain(self, seconds: float = DRAIN_SECONDS) -> None:
        """Wait (sleeping, so the workers can take the GIL) until the backend let go of all."""
        start = time.monotonic()
        self.release()
        while self.held:
            waited = time.monotonic() - start
            if waited >= seconds or (waited >= FAILED_SECONDS and all(failed for *_, failed in self.held)):
                return
            time.sleep(0.0005)
            self.release()


@attrs.define(eq=False)
class Unheld(InFlight):
    """An in-process transport's: its calls hold no tensor once they returned, so nothing waits."""

    def release(self) -> None:
        self.held.clear()

    def drain(self, seconds: float = DRAIN_SECONDS) -> None:
        self.held.clear()


def keep_forever(*objects: object) -> None:
    """Keep ``objects`` (a group whose collective is stuck in the backend, and its tensors) until
    the process ends, beyond interpreter finalization: freeing that group would wait for the
    collective (up to the group's timeout), and a worker thread that lets go of a tensor nobody
    else holds needs the GIL, which it cannot have during finalization (the process aborts)."""
    for obj in objects:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def _count(t: torch.Tensor) -> int:
    """How many C++ references the tensor has (the Python object's own included)."""
    return int(t._use_count())  # type: ignore[attr-defined]  # not in torch's stubs


_LIVE: weakref.WeakSet[InFlight] = weakref.WeakSet()


@atexit.register
def _drain_all() -> None:
    for inflight in list(_LIVE):
        inflight.drain()
    # tensors let go is not the end: the worker destroys the work's thread-local state next,
    # which may hold Python objects (a backward's context, saved-tensor hooks)
    _workers.settle()
