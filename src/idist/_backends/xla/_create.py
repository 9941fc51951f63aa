"""Making an ``XlaContext`` for the calling thread's replica (``torch_xla.runtime``)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TypeVar

from ..._core import ContextState
from ..._topology import Topology
from . import _lib
from ._comm import make_comm
from ._device import XlaDevice

if TYPE_CHECKING:
    from ._context import XlaContext

C = TypeVar("C", bound="XlaContext")

#: how long a device thread waits for its turn to compile before giving up (seconds)
DEFAULT_TURN_TIMEOUT = 300.0


def _build(cls: type[C], launcher: str, timeout: float) -> C:
    xr = _lib.xr
    device = _lib.torch_xla.device()
    rank, size = xr.global_ordinal(), xr.world_size()
    device_type = str(xr.device_type())
    per_node = max(1, xr.local_device_count()) if size > 1 else 1
    ordered = device_type == "CPU" and xr.addressable_device_count() > 1 and size > 1
    config = {
        "launcher": launcher,
        "rank": f"torch_xla.runtime.global_ordinal()={rank}",
        "world_size": f"torch_xla.runtime.world_size()={size}",
        "device": f"{device} ({device_type}, PJRT_DEVICE={os.environ.get('PJRT_DEVICE', '')})",
    }
    if ordered:
        config["collectives"] = "compiled in rank order (several XLA CPU device threads in one process)"
    topology = Topology(
        rank=rank,
        world_size=size,
        local_rank=xr.local_ordinal(),
        nproc_per_node=per_node,
        node_rank=rank // per_node,
        nnodes=max(1, size // per_node),
    )
    xla = XlaDevice(device=device, rank=rank, world_size=size, ordered=ordered, turn_timeout=timeout)
    state = ContextState(make_comm(xla, tuple(range(size))))
    return cls(
        backend="xla-tpu", topology=topology, device=device, config=config, device_type=device_type, _state=state
    )


def create(cls: type[C], name: str, *, timeout: float | None = None, **unknown: object) -> C:
    """The XLA device of the calling thread and its replica (``torch_xla.runtime``).

    Run it inside each replica (``xmp.spawn``/``torch_xla.launch``, ``idist.spawn(...,
    backend="xla-tpu")``, or once in a single-device process). ``timeout`` (seconds)
    bounds the wait for peers' turns in the multi-thread CPU mode. Raises
    ``BackendUnavailableError`` when torch_xla is missing or cannot load.
    """
    if unknown:
        raise TypeError(f"unknown options for backend {name!r}: {', '.join(sorted(unknown))}")
    _lib.load()
    return _build(cls, "torch_xla runtime", float(timeout) if timeout is not None else DEFAULT_TURN_TIMEOUT)


def adopt(cls: type[C]) -> C | None:
    """A context for an XLA replica the user started (xmp.spawn), once its runtime is up."""
    _lib.load()
    if not _lib.C._xla_runtime_is_initialized() or _lib.xr.world_size() < 2:
        return None
    return _build(cls, "adopted torch_xla replica", DEFAULT_TURN_TIMEOUT)
