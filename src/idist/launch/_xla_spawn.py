"""``spawn``/``Parallel`` with ``backend="xla-tpu"``: the launcher process runs ``torch_xla.launch``.

torch_xla decides its replicas: ``nproc_per_node=1`` runs one replica in the launcher
process; ``N > 1`` on the XLA CPU device sets ``CPU_NUM_DEVICES=N`` (one process, N device
threads); ``N > 1`` on TPU/GPU uses every device, and each replica checks there are N.
Each replica makes its own ``XlaContext`` current in its thread, calls
``fn(local_rank, ...)`` and closes it; one that raises reports and ends its XLA process at
once (torch_xla would wait for its blocked peers forever). See docs/design.md, "Launching".
"""

from __future__ import annotations

import os
import threading

import attrs

from .._backends.xla import _lib
from .._context import DistContext
from .._errors import LaunchConfigError, LaunchError
from .._exit import exit_now
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
            exit_now(1)  # the other device threads may be waiting for this one in a collective

    def _check(self, ctx: DistContext) -> None:
        n = self.job.nproc
        if ctx.world_size != n:
            var = NUM_DEVICES_VAR.get(self.device_type, f"{self.device_type}_NUM_DEVICES")
            raise LaunchConfigError(
                f"torch_xla started {ctx.world_size} replicas (one per {self.device_type} device), not "
                f"nproc_per_node={n}: pass nproc_per_node={ctx.world_size} (or 1 for a single replica), "
                f"or limit the devices with {var}"
            )


def drive(job: Job) -> list[object]:
    """In the launcher process: ``torch_xla.launch``, then results or the first failure."""
    _lib.load()  # BackendUnavailableError with the hint when torch_xla cannot load
    torch_xla, xr = _lib.torch_xla, _lib.xr

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
