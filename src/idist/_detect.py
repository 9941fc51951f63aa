"""Which launcher started this process, and which backend ``initialize()`` picks for it.

Reads the environment and ``sys.modules`` only: detecting never imports torch_xla or
horovod, and never writes anything.
"""

from __future__ import annotations

import os
import sys

import torch

from ._launch_env import detect

#: set by torch_xla.launch / xmp.spawn in the process that runs the replicas (and only there)
XLA_LAUNCHER_VARS = ("PJRT_LOCAL_PROCESS_COUNT",)
#: the backend ``idist run --backend`` chose for its ranks (else CUDA decides)
BACKEND_VAR = "IDIST_BACKEND"
#: variables that mean "horovodrun (or horovod.run) started this process as one rank"
HOROVOD_VARS = ("HOROVOD_RANK", "HOROVOD_HOSTNAME")


def xla_replica() -> bool:
    """Whether torch_xla's launcher started this process's replicas.

    Both must hold: torch_xla is loaded (it was, to run the replicas; checking never imports
    it) and its launcher set ``PJRT_LOCAL_PROCESS_COUNT`` here. ``PJRT_DEVICE`` alone does
    not count: TPU VMs export it for every process, XLA or not.
    """
    return "torch_xla" in sys.modules and all(v in os.environ for v in XLA_LAUNCHER_VARS)


def launched_by() -> str | None:
    """The launcher that started this process (torchrun, slurm, openmpi, mpich, horovodrun, torch_xla), or None."""
    if any(v in os.environ for v in HOROVOD_VARS):
        return "horovodrun"
    if xla_replica():
        return "torch_xla"
    info = detect(os.environ, need_master=False)
    return None if info is None else info.launcher


def detect_backend() -> str:
    """The backend ``initialize()`` picks with no name: from the launcher's environment."""
    launcher = launched_by()
    if launcher == "horovodrun":
        return "horovod"
    if launcher == "torch_xla":
        return "xla-tpu"
    if launcher is not None:
        chosen = os.environ.get(BACKEND_VAR)  # `idist run --backend gloo|nccl` says which
        if chosen in ("gloo", "nccl"):
            return chosen
        return "nccl" if torch.cuda.is_available() else "gloo"
    return "serial"
