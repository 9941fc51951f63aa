"""Reading a launcher's environment: torchrun / idist.spawn, SLURM, OpenMPI, MPICH/PMI.

``detect(environ)`` returns the topology and records which variables decided what, or
None when no launcher variables are present. Partial or contradictory variables raise
``LaunchEnvironmentError`` naming them. Nothing here writes to the environment.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping

import attrs

from ._errors import LaunchEnvironmentError
from ._topology import Topology

TORCHRUN = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
SLURM = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_NODELIST", "SLURM_JOB_ID")
OMPI = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
PMI = ("PMI_RANK", "PMI_SIZE")


@attrs.frozen(kw_only=True)
class LaunchInfo:
    """What a launcher's environment says: this rank's topology, the rendezvous, and why."""

    launcher: str
    topology: Topology
    master_addr: str | None
    master_port: int | None
    #: field -> the variables (or "argument") that decided it
    decided_by: Mapping[str, str]


def _info(
    launcher: str,
    rank: int,
    world: int,
    local: int,
    nproc: int,
    node: int,
    nnodes: int,
    addr: str | None,
    port: int | None,
    decided: Mapping[str, str],
) -> LaunchInfo:
    topology = Topology(
        rank=rank, world_size=world, local_rank=local, nproc_per_node=nproc, node_rank=node, nnodes=nnodes
    )
    return _check(
        LaunchInfo(launcher=launcher, topology=topology, master_addr=addr, master_port=port, decided_by=decided)
    )


#: variables that count something (at least 1); every other integer variable is an index (at least 0)
_COUNTS = (
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NNODES",
    "SLURM_NTASKS",
    "SLURM_NNODES",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_SIZE",
    "MPI_LOCALNRANKS",
)


def _int(env: Mapping[str, str], name: str) -> int:
    """The integer in variable ``name``, within its range, or ``LaunchEnvironmentError`` naming it."""
    raw = env[name]
    try:
        value = int(raw)
    except ValueError:
        raise LaunchEnvironmentError(f"{name}={raw!r} is not an integer") from None
    low, high = (1, 65535) if name == "MASTER_PORT" else (1, None) if name in _COUNTS else (0, None)
    if value < low or (high is not None and value > high):
        allowed = f"{low}..{high}" if high is not None else f"{low} or more"
        raise LaunchEnvironmentError(f"{name}={raw!r} is out of range: it must be {allowed}")
    return value


def _require(env: Mapping[str, str], names: tuple[str, ...], launcher: str) -> None:
    missing = [n for n in names if n not in env]
    if missing:
        present = [n for n in names if n in env]
        raise LaunchEnvironmentError(
            f"partial {launcher} environment: {', '.join(present)} set but "
            f"{', '.join(missing)} missing; set all of {', '.join(names)} or none"
        )


def expand_hostlist(nodelist: str) -> list[str]:
    """Expand a SLURM hostlist such as ``node[01-03,7],gpu-a`` into host names."""
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", nodelist):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            hosts.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for item in ranges.split(","):
            lo, _, hi = item.partition("-")
            if not hi:
                hosts.append(f"{prefix}{lo}{suffix}")
                continue
            width = len(lo)
            hosts += [f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1)]
    return hosts


def _check(info: LaunchInfo) -> LaunchInfo:
    t = info.topology
    if not 0 <= t.rank < t.world_size:
        raise LaunchEnvironmentError(
            f"rank {t.rank} is outside 0..{t.world_size - 1} "
            f"({info.decided_by.get('rank')}, {info.decided_by.get('world_size')})"
        )
    if not 0 <= t.local_rank < t.nproc_per_node:
        raise LaunchEnvironmentError(
            f"local rank {t.local_rank} is outside 0..{t.nproc_per_node - 1} "
            f"({info.decided_by.get('local_rank')}, {info.decided_by.get('nproc_per_node')})"
        )
    return info


def _torchrun(env: Mapping[str, str], need_master: bool = True) -> LaunchInfo:
    _require(env, TORCHRUN if need_master else TORCHRUN[:2], "torchrun-style")
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    local = _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
    nproc = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
    node = _int(env, "GROUP_RANK") if "GROUP_RANK" in env else rank // max(nproc, 1)
    nnodes = _int(env, "NNODES") if "NNODES" in env else max(1, world // max(nproc, 1))
    decided = {
        "rank": f"RANK={env['RANK']}",
        "world_size": f"WORLD_SIZE={env['WORLD_SIZE']}",
        "local_rank": f"LOCAL_RANK={env['LOCAL_RANK']}" if "LOCAL_RANK" in env else "RANK",
        "nproc_per_node": (
            f"LOCAL_WORLD_SIZE={env['LOCAL_WORLD_SIZE']}" if "LOCAL_WORLD_SIZE" in env else "WORLD_SIZE"
        ),
        "master": (
            f"MASTER_ADDR={env['MASTER_ADDR']} MASTER_PORT={env['MASTER_PORT']}"
            if "MASTER_ADDR" in env and "MASTER_PORT" in env
            else "init_method (no MASTER_ADDR/MASTER_PORT)"
        ),
    }
    addr = env.get("MASTER_ADDR")
    port = _int(env, "MASTER_PORT") if "MASTER_PORT" in env else None
    return _info("torchrun", rank, world, local, nproc, node, nnodes, addr, port, decided)


def _slurm(env: Mapping[str, str]) -> LaunchInfo:
    _require(env, SLURM, "SLURM")
    rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
    hostlist = env["SLURM_JOB_NODELIST"]
    hosts = expand_hostlist(hostlist)
    nnodes = _int(env, "SLURM_NNODES") if "SLURM_NNODES" in env else len(hosts)
    local = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
    node = _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0
    per_node = env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "")
    m = re.match(r"\d+", per_node)
    nproc = int(m.group()) if m else max(1, world // max(nnodes, 1))
    addr = env.get("MASTER_ADDR", hosts[0] if hosts else None)
    port = _int(env, "MASTER_PORT") if "MASTER_PORT" in env else 15000 + _int(env, "SLURM_JOB_ID") % 20000
    master = f"MASTER_ADDR={addr}" if "MASTER_ADDR" in env else f"first host of SLURM_JOB_NODELIST={hostlist}"
    master += " MASTER_PORT" if "MASTER_PORT" in env else f", port 15000 + SLURM_JOB_ID={env['SLURM_JOB_ID']} % 20000"
    decided = {
        "rank": f"SLURM_PROCID={env['SLURM_PROCID']}",
        "world_size": f"SLURM_NTASKS={env['SLURM_NTASKS']}",
        "local_rank": f"SLURM_LOCALID={env.get('SLURM_LOCALID', '(unset, 0)')}",
        "nproc_per_node": f"SLURM_TASKS_PER_NODE={per_node or '(unset)'}",
        "master": master,
    }
    return _info("slurm", rank, world, local, nproc, node, nnodes, addr, port, decided)


def _mpi(env: Mapping[str, str], launcher: str, names: dict[str, str], job: str | None) -> LaunchInfo:
    rank, world = _int(env, names["rank"]), _int(env, names["size"])
    local = _int(env, names["local_rank"]) if names["local_rank"] in env else rank
    nproc = _int(env, names["local_size"]) if names["local_size"] in env else world
    nnodes = max(1, -(-world // max(nproc, 1)))
    node = rank // max(nproc, 1)
    addr = env.get("MASTER_ADDR") or ("127.0.0.1" if nproc == world else None)
    if "MASTER_PORT" in env:
        port: int | None = _int(env, "MASTER_PORT")
    elif job is not None and nproc == world:
        # Same job id on every rank of one job, different between jobs.
        port = 20000 + zlib.crc32(env[job].encode()) % 20000
    else:
        port = None
    fields = {"rank": "rank", "size": "world_size", "local_rank": "local_rank", "local_size": "nproc_per_node"}
    decided = {fields[k]: f"{v}={env[v]}" for k, v in names.items() if v in env}
    if "MASTER_PORT" in env:
        decided["master"] = f"MASTER_ADDR/MASTER_PORT={addr}:{port}"
    elif port is not None:
        decided["master"] = f"single node: {addr}, port from {job}"
    else:
        decided["master"] = "unset: set MASTER_ADDR and MASTER_PORT for a multi-node gloo/nccl job"
    return _info(launcher, rank, world, local, nproc, node, nnodes, addr, port, decided)


def _ompi(env: Mapping[str, str]) -> LaunchInfo:
    _require(env, OMPI, "OpenMPI")
    names = {
        "rank": "OMPI_COMM_WORLD_RANK",
        "size": "OMPI_COMM_WORLD_SIZE",
        "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK",
        "local_size": "OMPI_COMM_WORLD_LOCAL_SIZE",
    }
    job = next((k for k in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_hnp_uri") if k in env), None)
    return _mpi(env, "openmpi", names, job)


def _pmi(env: Mapping[str, str]) -> LaunchInfo:
    _require(env, PMI, "MPICH/PMI")
    names = {"rank": "PMI_RANK", "size": "PMI_SIZE", "local_rank": "MPI_LOCALRANKID", "local_size": "MPI_LOCALNRANKS"}
    job = next((k for k in ("PMI_KVSNAME", "PMI_JOBID", "HYDI_CONTROL_FD") if k in env), None)
    return _mpi(env, "mpich", names, job)


_DETECTORS = (
    # MASTER_ADDR/MASTER_PORT alone do not make a torchrun environment: users set them
    # for srun/mpirun jobs too. RANK or WORLD_SIZE does.
    ("torchrun", ("RANK", "WORLD_SIZE"), _torchrun),
    ("slurm", SLURM, _slurm),
    ("openmpi", OMPI, _ompi),
    ("mpich", PMI, _pmi),
)


def detect(env: Mapping[str, str], *, need_master: bool = True) -> LaunchInfo | None:
    """The launcher environment in ``env``, or None when no launcher variables are set.

    ``need_master=False``: a torchrun-style environment may lack ``MASTER_ADDR``/``MASTER_PORT``
    (an ``init_method`` such as ``file://`` is the rendezvous).

    torchrun-style variables win over the launcher's own (torchrun inside SLURM, or
    idist.spawn under mpirun), but a RANK/WORLD_SIZE that contradicts the launcher's is
    an error.
    """
    found = [(name, fn) for name, keys, fn in _DETECTORS if any(k in env for k in keys)]
    if not found:
        return None
    infos = [_torchrun(env, need_master) if name == "torchrun" else fn(env) for name, fn in found]
    first = infos[0]
    for other in infos[1:]:
        a, b = first.topology, other.topology
        if first.launcher == "torchrun" and b.world_size != a.world_size and "SLURM_NTASKS" in env:
            continue  # torchrun inside one SLURM task per node: different worlds by design
        if (b.rank, b.world_size) != (a.rank, a.world_size):
            raise LaunchEnvironmentError(
                f"{first.launcher} says rank {a.rank} of {a.world_size} "
                f"({first.decided_by['rank']}, {first.decided_by['world_size']}) but "
                f"{other.launcher} says rank {b.rank} of {b.world_size} "
                f"({other.decided_by['rank']}, {other.decided_by['world_size']}); unset one of them"
            )
    return first
