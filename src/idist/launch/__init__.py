"""Starting distributed jobs: ``spawn``, ``Parallel`` and the pieces the CLI shares.

spawn / Parallel (spawn mode)          Parallel (in place), CLI
─────────────────────────────          ────────────────────────
_spawn   the two signatures            _parallel  mode choice, initialize/finalize
_procs   start, watch, stop ranks      idist._cli torch.distributed.run / horovodrun
_child   inside each rank
_ports   reserved rendezvous ports
"""

from __future__ import annotations

from .._errors import LaunchConfigError, LaunchError
from ._parallel import Parallel, launched_by
from ._ports import PortReservation, reserve_port
from ._procs import SpawnHandle, StartMethod
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
