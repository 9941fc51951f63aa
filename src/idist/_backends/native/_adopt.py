"""Adopting a process group the user initialized with torch directly (never destroyed by idist)."""

from __future__ import annotations

import os

import attrs
import torch.distributed as dist
from torch._C._distributed_c10d import Store

from ..._errors import LaunchEnvironmentError
from ..._launch_env import LaunchInfo, detect
from ..._liveness_limit import limit_from
from ..._topology import Topology
from ._create import CREATED, DEFAULT_TIMEOUT, C, _build, _explicit_info

#: ignite's ``set_local_rank``: the local rank of this process when a group is adopted and
#: no launcher variable says it (process-wide, as in ignite)
_local_rank_hint: list[int] = []


def adopt(cls: type[C]) -> C | None:
    """Wrap a process group the user initialized with torch directly (never destroyed by us)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    pg = dist.group.WORLD
    if pg is None or id(pg) in CREATED:
        return None
    name = str(dist.get_backend(pg))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        env = detect(os.environ)
    except LaunchEnvironmentError:
        env = None
    if env is None or (env.topology.rank, env.topology.world_size) != (rank, world):
        env = _explicit_info(rank, world, None, None)
    if _local_rank_hint and env.decided_by.get("local_rank", "RANK") in ("RANK", "argument"):
        env = _hinted(env, _local_rank_hint[-1])
    env = attrs.evolve(env, launcher=f"adopted torch.distributed ({env.launcher})")
    try:
        store: Store | None = dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError):
        store = None
    backend = name if name in ("gloo", "nccl", "mpi") else "gloo"
    limit = limit_from(None, os.environ)
    return _build(cls, backend, pg, store, env, DEFAULT_TIMEOUT, owns_default=False, liveness=limit)


def set_local_rank_hint(index: int) -> None:
    _local_rank_hint[:] = [index]


def _hinted(info: LaunchInfo, local_rank: int) -> LaunchInfo:
    """``info`` with the local rank that ``set_local_rank`` gave (processes per node from
    ``LOCAL_WORLD_SIZE``, else the whole world)."""
    t = info.topology
    nproc = int(os.environ.get("LOCAL_WORLD_SIZE", t.world_size))
    if not 0 <= local_rank < nproc:
        raise LaunchEnvironmentError(
            f"set_local_rank({local_rank}) is outside 0..{nproc - 1} ({nproc} processes per node); "
            "pass this process's index among the processes of its node"
        )
    topology = Topology(
        rank=t.rank,
        world_size=t.world_size,
        local_rank=local_rank,
        nproc_per_node=nproc,
        node_rank=t.rank // nproc,
        nnodes=max(1, -(-t.world_size // nproc)),
    )
    decided = {**info.decided_by, "local_rank": f"set_local_rank({local_rank})"}
    return attrs.evolve(info, topology=topology, decided_by=decided)
