"""Making a ``HorovodContext``: ``hvd.init`` with dynamic process sets, or adopting one."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TypeVar

import torch

from ... import _environ
from ..._core import ContextState
from ..._errors import AlreadyInitializedError, BackendUnavailableError
from ..._topology import Topology
from . import _lib
from ._comm import HorovodComm

if TYPE_CHECKING:
    from ._context import HorovodContext

C = TypeVar("C", bound="HorovodContext")


def _build(cls: type[C], owns_init: bool, launcher: str) -> C:
    hvd = _lib.hvd
    rank, size = hvd.rank(), hvd.size()
    local_rank = hvd.local_rank()
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    config = {
        "launcher": launcher,
        "rank": f"hvd.rank()={rank}",
        "world_size": f"hvd.size()={size}",
        "controller": "mpi" if hvd.mpi_enabled() else "gloo",
    }
    topology = Topology(
        rank=rank,
        world_size=size,
        local_rank=local_rank,
        nproc_per_node=hvd.local_size(),
        node_rank=hvd.cross_rank(),
        nnodes=hvd.cross_size(),
    )
    state = ContextState(HorovodComm(hvd.global_process_set, tuple(range(size)), rank))
    ctx = cls(backend="horovod", topology=topology, device=device, config=config, _owns_init=owns_init, _state=state)
    if device.type == "cuda":
        previous = torch.cuda.current_device()
        torch.cuda.set_device(device)
        state.on_close.append(lambda: torch.cuda.set_device(previous))
    return ctx


def is_available() -> bool:
    try:
        _lib.load()
    except BackendUnavailableError:
        return False
    return True


def create(cls: type[C], name: str, *, timeout: float | None = None, **unknown: object) -> C:
    """Initialize Horovod (``hvd.init`` with dynamic process sets) and wrap it.

    Topology comes from Horovod's launcher (horovodrun / horovod.run); without one it is
    a world of one. ``timeout`` (seconds) sets Horovod's gloo timeout. Raises
    ``BackendUnavailableError`` (horovod missing) or ``AlreadyInitializedError``
    (Horovod already initialized: ``idist.current()`` adopts it).
    """
    if unknown:
        raise TypeError(f"unknown options for backend {name!r}: {', '.join(sorted(unknown))}")
    _lib.load()
    hvd = _lib.hvd
    if hvd.is_initialized():
        raise AlreadyInitializedError(
            "Horovod is already initialized; idist.current() adopts it, or call hvd.shutdown() first"
        )
    env = {"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}
    if timeout is not None:
        env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(max(1, round(float(timeout))))
    with _environ.changed(env):
        hvd.init()
    launcher = "horovodrun" if "HOROVOD_RANK" in os.environ else "none"
    try:
        return _build(cls, owns_init=True, launcher=launcher)
    except BaseException:
        hvd.shutdown()
        raise


def adopt(cls: type[C]) -> C | None:
    """Wrap a Horovod runtime the user initialized (never shut down by us)."""
    _lib.load()
    if not _lib.hvd.is_initialized():
        return None
    return _build(cls, owns_init=False, launcher="adopted horovod")
