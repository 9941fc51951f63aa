"""The per-rank variables of every launcher idist knows, which a new launch removes from its ranks.

A launch from inside another launcher's rank (``idist.spawn`` under torchrun, ``idist run`` in a
SLURM step) must not pass that rank's own RANK, SLURM_PROCID... to ranks that are given new ones.
"""

from __future__ import annotations

#: removed in each rank a launch starts: they would contradict the rank it is given
INHERITED_RANK_VARS = (
    # idist run, idist.spawn
    "IDIST_LAUNCHER",
    # torchrun
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_ERROR_FILE",
    # SLURM
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_ID",
    # OpenMPI
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_COMM_WORLD_NODE_RANK",
    # MPICH
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    # Horovod
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE",
    "HOROVOD_HOSTNAME",
    # XLA (PJRT)
    "PJRT_LOCAL_PROCESS_RANK",
    "PJRT_LOCAL_PROCESS_COUNT",
)
