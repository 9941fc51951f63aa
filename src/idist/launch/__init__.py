"""Starting distributed jobs: ``spawn``, ``Parallel``, and what the ``idist`` CLI shares.

_spawn      spawn's two forms (torch.mp and ignite)    _parallel   Parallel's two modes
_plan       LaunchPlan, argument checks                  _procs      start one process per rank
_handle     SpawnHandle: watch, fail fast, stop all      _child      inside each rank
_ports      reserved rendezvous ports                    _driven     launches through horovod.run / torch_xla
_hvd_spawn  the horovod.run driver                       _xla_spawn  the torch_xla.launch driver
_reports    how driven ranks report results and failures
"""

from __future__ import annotations

from .._detect import launched_by
from .._errors import LaunchConfigError, LaunchError
from ._handle import SpawnHandle
from ._parallel import Parallel
from ._plan import StartMethod
from ._ports import PortReservation, reserve_port
from ._spawn import spawn

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
