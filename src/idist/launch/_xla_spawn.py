"""``spawn``/``Parallel`` with ``backend="xla-tpu"``: the launcher process runs ``torch_xla.launch``.

torch_xla 2.9 decides the replicas itself: ``xmp.spawn``/``torch_xla.launch`` accept
``nprocs=None`` (one replica per device: a process per TPU chip, or on the XLA CPU device
one process with a thread per device) or ``nprocs=1`` (one replica, in the calling
process), and raise ``ValueError`` for anything else. idist maps ``nproc_per_node=N``:

- ``N == 1``: ``torch_xla.launch(..., debug_single_process=True)``, torch_xla's
  ``nprocs=1``: one replica, run in the launcher process;
- ``N > 1`` on the XLA CPU device: ``CPU_NUM_DEVICES=N`` (and ``XLA_THREAD_POOL_SIZE``,
  see the XLA backend) in the launcher process, then ``torch_xla.launch``: one XLA
  process, N device threads;
- ``N > 1`` on TPU/GPU: ``torch_xla.launch`` with every device, and each replica checks
  that torch_xla started N of them (``LaunchConfigError`` saying how many it found and
  what to pass otherwise).

Each replica makes its own ``XlaContext`` current in its thread only (the device threads
share one process, so there is no process default to share), calls
``fn(local_rank, ...)`` and closes it. Failure: torch_xla waits for every replica before
it returns, and replicas blocked in a collective would wait forever for one that raised;
so a replica that raises reports it and ends its XLA process at once (``os._exit``), the
launcher sees the process pool break, and the report names the replica.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import attrs

from .._context import DistContext
from .._errors import LaunchConfigError, LaunchError
from ._child import _flush
from ._driven import Job, call_rank
from ._reports import Reporter, ReportFolder, rank_failure

#: PJRT device type -> the variable that limits its device count (torch_xla's X_NUM_DEVICES)
NUM_DEVICES_VAR = {"CPU": "CPU_NUM_DEVICES", "TPU": "TPU_NUM_DEVICES", "CUDA": "GPU_NUM_DEVICES"}


@attrs.frozen
class _Replica:
    """What torch_xla calls for each replica: ``replica(global_ordinal)``."""

    job: Job
    reporter: Reporter
    device_type: str

    def __call__(self, index: int) -> None:
        threaded = threading.current_thread() is not threading.main_thread()
        try:
            call_rank(self.job, index, index, self.reporter, scoped=True, check=self._check)
        except BaseException:
            if not threaded:
                raise  # one replica in this process: torch_xla.launch raises it to the launcher
            _flush()
            os._exit(1)  # the other device threads may be waiting for this one in a collective

    def _check(self, ctx: DistContext) -> None:
        n = self.job.nproc
        if ctx.world_size != n:
            var = NUM_DEVICES_VAR.get(self.device_type, f"{self.device_type}_NUM_DEVICES")
            raise LaunchConfigError(
                f"torch_xla started {ctx.world_size} replicas (one per {self.device_type} device), not "
                f"nproc_per_node={n}: pass nproc_per_node={ctx.world_size} (or 1 for a single replica), "
                f"or limit the devices with {var}"
            )


def drive(job: Job) -> list[Any]:
    """In the launcher process: ``torch_xla.launch``, then results or the first failure."""
    from .._backends import _xla

    _xla._load()  # BackendUnavailableError with the hint when torch_xla cannot load
    import torch_xla
    import torch_xla.runtime as xr

    n = job.nproc
    device_type = str(xr.device_type() or "CPU")  # torch_xla's import picked one if PJRT_DEVICE was unset
    if device_type == "CPU":
        # This process only exists for this launch: its environment is ours to set.
        os.environ["CPU_NUM_DEVICES"] = str(n)
        os.environ.setdefault("XLA_THREAD_POOL_SIZE", str(4 * n + 8))
    with ReportFolder(job.reports) as folder:
        replica = _Replica(job, folder.reporter, device_type)
        try:
            torch_xla.launch(replica, start_method=job.start_method, debug_single_process=n == 1)
        except Exception as exc:
            err = folder.first_error()
            if err is not None:
                raise rank_failure(err, n) from exc
            raise LaunchError(
                f"torch_xla.launch failed before any replica reported: {type(exc).__name__}: {exc}"
            ) from exc
        return folder.results(n, "torch_xla.launch")
