"""Starting distributed jobs: ``spawn``, ``Parallel``, and what the ``idist`` CLI shares.

_spawn      spawn's two forms (torch.mp and ignite)    _parallel   Parallel's two modes
_plan       LaunchPlan, argument checks                  _procs      start one process per rank
_handle     SpawnHandle: watch, fail fast, stop all      _child      inside each rank
_ports      reserved rendezvous ports                    _driven     launches through horovod.run / torch_xla
_hvd_spawn  the horovod.run driver                       _xla_spawn  the torch_xla.launch driver
_reports    how driven ranks report results and failures
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _lazy

if TYPE_CHECKING:
    from ._api import *  # noqa: F403 (the names load on first use: ``idist run`` imports no torch)

__all__ = [
    "LaunchConfigError",
    "LaunchError",
    "Parallel",
    "PortReservation",
    "SpawnHandle",
    "StartMethod",
    "launched_by",
    "reserve_port",
    "spawn",
]

if not TYPE_CHECKING:
    __getattr__, __dir__ = _lazy.exports(globals(), "._api", __all__)
