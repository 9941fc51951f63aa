"""``idist run``'s command line: its flags, their checks, and the launch they describe.

Every value is checked before anything starts, and a value that cannot work ends the
command with ``idist: error: ...`` and status 2 (as argparse's own errors do): sizes, times,
ports, addresses (IPv6 included; the address must be this machine's on node 0 and reachable
from the others), a backend this machine cannot run, and flags a backend cannot honour.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
from typing import Any

from .. import _netif
from .._errors import LaunchConfigError
from .._liveness_limit import limit_from
from . import _elastic
from ._hvd_cli import run_horovodrun
from ._plan import MAX_LOCAL_RANKS, MAX_WORLD_SIZE, LaunchPlan
from ._scripts import run_script

#: Status for a command line that cannot work (as argparse uses).
USAGE_ERROR = 2
#: the flags whose values ``--backend horovod`` cannot pass on (horovodrun has no such knobs)
NOT_FOR_HOROVOD = {
    "master_addr": "--master-addr",
    "master_port": "--master-port",
    "rdzv_timeout": "--rdzv-timeout",
    "liveness": "--liveness",
    "checked": "--checked",
    "pdb_rank": "--pdb-rank",
}


class UsageError(Exception):
    """A command line that cannot work: the message follows ``idist: error:``."""


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    run = sub.add_parser(
        "run",
        help="run a script on N ranks per node",
        description="Run a script on N ranks per node; each output line is prefixed with its rank.",
        allow_abbrev=False,
    )
    run.add_argument("-n", "--nproc-per-node", "--nprocs", dest="nproc", type=int, default=1, help="ranks per node")
    run.add_argument(
        "--nnodes",
        default="1",
        metavar="N|MIN:MAX",
        help="number of nodes (default 1); MIN:MAX runs an elastic job that goes on with MIN to MAX nodes",
    )
    run.add_argument("--node-rank", type=int, default=0, help="this node's rank, 0..nnodes-1")
    run.add_argument("--master-addr", default=None, help="rendezvous address (default: loopback)")
    run.add_argument("--master-port", type=int, default=None, help="rendezvous port (default: a free one, 1 node)")
    run.add_argument(
        "--backend",
        default=None,
        choices=("gloo", "nccl", "horovod"),
        help="gloo/nccl: the ranks' backend (default: nccl with CUDA, else gloo), started here; horovod: "
        "through horovodrun",
    )
    run.add_argument("--checked", action="store_true", help="checked mode in every rank (IDIST_CHECKED=1)")
    run.add_argument(
        "--rdzv-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds the ranks wait for each other to join (default: the process group's timeout)",
    )
    liveness_help = "seconds without a heartbeat after which a rank is lost (default 30; 0 turns it off)"
    run.add_argument("--liveness", type=float, default=None, metavar="S", help=liveness_help)
    run.add_argument(
        "--pdb-rank",
        type=int,
        default=None,
        metavar="R",
        help="debug rank R: it reads stdin (instead of rank 0), stops at breakpoint() (the others skip theirs) "
        "and opens pdb on an uncaught exception",
    )
    run.add_argument(
        "--max-restarts",
        type=int,
        default=None,
        metavar="K",
        help="elastic: restart the script up to K times after a rank fails or a node is lost (default 0)",
    )
    run.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT", help="elastic: --master-addr:--master-port")
    run.add_argument("-m", "--module", action="store_true", help="run the target as a module (python -m)")
    run.add_argument("script", help="the script (or module with -m) to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")


def _check_elastic(a: argparse.Namespace) -> _elastic.ElasticPlan | None:
    """The elastic launch ``--nnodes MIN:MAX`` / ``--max-restarts`` / ``--rdzv-endpoint`` ask for, else None
    (``a.nnodes`` becomes the number of nodes, MAX for an elastic job)."""
    try:
        low, high = _elastic.node_range(str(a.nnodes))
        a.nnodes, fixed = high, ":" not in str(a.nnodes)
        if a.rdzv_endpoint is not None:
            if a.master_addr is not None or a.master_port is not None:
                raise UsageError("pass --rdzv-endpoint or --master-addr/--master-port, not both")
            a.master_addr, a.master_port = _elastic.endpoint_of(a.rdzv_endpoint)
        if fixed and a.max_restarts is None and a.rdzv_endpoint is None:
            return None
        if a.backend == "horovod":
            raise UsageError(
                "--backend horovod cannot run an elastic job (--nnodes MIN:MAX, --max-restarts, --rdzv-endpoint): "
                "horovodrun has its own (horovodrun --min-np); use --backend gloo or nccl"
            )
        if a.pdb_rank is not None:
            raise UsageError("--pdb-rank debugs one rank of a fixed job: drop --nnodes MIN:MAX / --max-restarts")
        if a.node_rank != 0:
            raise UsageError("an elastic job numbers its nodes itself at each rendezvous: drop --node-rank")
        return _elastic.plan((low, high), a.nproc, a.max_restarts, a.master_addr, a.master_port, a.rdzv_timeout)
    except LaunchConfigError as exc:
        raise UsageError(str(exc)) from None


def _check_sizes(a: argparse.Namespace) -> None:
    if not 1 <= a.nproc <= MAX_LOCAL_RANKS:
        raise UsageError(f"-n must be in 1..{MAX_LOCAL_RANKS} (ranks on this node), got {a.nproc}")
    if a.nnodes < 1:
        raise UsageError(f"--nnodes must be at least 1, got {a.nnodes}")
    if a.nproc * a.nnodes > MAX_WORLD_SIZE:
        raise UsageError(f"-n {a.nproc} x --nnodes {a.nnodes} ranks is more than {MAX_WORLD_SIZE}")
    if not 0 <= a.node_rank < a.nnodes:
        raise UsageError(f"--node-rank {a.node_rank} is outside 0..{a.nnodes - 1}")
    if a.master_port is not None and not 0 < a.master_port < 65536:
        raise UsageError(f"--master-port must be in 1..65535, got {a.master_port}")
    if a.nnodes > 1 and a.master_port is None and a.backend != "horovod":
        raise UsageError(
            f"--nnodes {a.nnodes}: pass the same --master-addr and --master-port on every node "
            "(node rank 0 hosts the rendezvous there)"
        )
    if a.pdb_rank is not None and not 0 <= a.pdb_rank < a.nproc * a.nnodes:
        raise UsageError(f"--pdb-rank {a.pdb_rank} is outside 0..{a.nproc * a.nnodes - 1} (the global ranks)")


def _check_times(a: argparse.Namespace) -> dict[str, str]:
    """The variables the ranks get for the time flags."""
    env = {}
    if a.rdzv_timeout is not None:
        if not (math.isfinite(a.rdzv_timeout) and a.rdzv_timeout > 0):
            raise UsageError(f"--rdzv-timeout must be a number of seconds > 0, got {a.rdzv_timeout!r}")
        env["IDIST_RDZV_TIMEOUT"] = repr(a.rdzv_timeout)
    if a.liveness is not None:
        try:  # the ranks' own check, once here rather than an error on every rank
            env["IDIST_LIVENESS"] = repr(limit_from(a.liveness, {}))
        except ValueError as exc:
            raise UsageError(f"--liveness: {exc}") from None
    return env


def _check_address(a: argparse.Namespace) -> None:
    """``--master-addr``: node 0 serves the rendezvous on it (an address of this machine); the
    other nodes must reach it. Brackets around an IPv6 address are dropped."""
    if a.master_addr is None:
        return
    addr = a.master_addr = a.master_addr.strip().removeprefix("[").removesuffix("]")
    if not addr:
        raise UsageError("--master-addr is empty")
    try:
        if a.node_rank == 0 and not a.elastic:  # an elastic job's host is the node that owns the address
            _netif.store_address(addr)
        else:
            _netif.route_to(addr)
    except _netif.NetifError as exc:
        raise UsageError(f"--master-addr {addr}: {exc}") from None


def _check_backend(a: argparse.Namespace) -> None:
    if a.backend == "horovod":
        given = [
            flag
            for key, flag in NOT_FOR_HOROVOD.items()
            if getattr(a, key) is not None and getattr(a, key) is not False
        ]
        if given:
            raise UsageError(
                f"--backend horovod cannot honour {', '.join(given)}: horovodrun chooses its own rendezvous and "
                "has no liveness, checked mode or debugged rank; drop them, or use --backend gloo"
            )
        if a.nnodes != 1:
            raise UsageError(
                "--backend horovod runs one node here; for several hosts call horovodrun -H host1:N,host2:N"
            )
    elif a.backend == "nccl":
        import torch  # deferred: the launcher imports torch only to count GPUs

        if not torch.cuda.is_available():
            raise UsageError("--backend nccl needs CUDA, which this machine does not have; use --backend gloo")
        if torch.cuda.device_count() < a.nproc:
            raise UsageError(
                f"--backend nccl runs one rank per GPU: -n {a.nproc}, but {torch.cuda.device_count()} are visible"
            )


def check(a: argparse.Namespace) -> dict[str, str]:
    """Check every flag (``UsageError`` for the first that cannot work); the ranks' variables."""
    a.elastic = _check_elastic(a)
    _check_sizes(a)
    _check_backend(a)
    env = _check_times(a)
    _check_address(a)
    if not a.module and not os.path.isfile(a.script):
        raise UsageError(f"no such script: {a.script!r} (use -m to run a module)")
    if a.checked:
        env["IDIST_CHECKED"] = "1"
    if a.backend in ("gloo", "nccl"):
        env["IDIST_BACKEND"] = a.backend
    return env


def run(a: argparse.Namespace) -> int:
    """``idist run``: the launcher's exit status (``UsageError`` before anything started)."""
    env = check(a)
    target = ["-m", a.script] if a.module else [a.script]
    if a.backend == "horovod":
        return _run_horovod(a, target)
    if a.elastic is not None:
        return _elastic.run(a.elastic, [*target, *a.args], env)
    plan = LaunchPlan(
        nproc_per_node=a.nproc,
        nnodes=a.nnodes,
        node_rank=a.node_rank,
        master_addr=a.master_addr,
        master_port=a.master_port,
    )
    node = f", node {a.node_rank}" if a.nnodes > 1 else ""
    reads = a.pdb_rank if a.pdb_rank is not None else 0
    return run_script(plan, [*target, *a.args], env, node, stdin_rank=reads, pdb=a.pdb_rank is not None)


def _run_horovod(a: argparse.Namespace, target: list[str]) -> int:
    exe = shutil.which("horovodrun")
    if exe is None:
        raise UsageError("--backend horovod needs horovodrun on PATH: pip install 'idist[horovod]' (see the README)")
    cmd = [exe, "-np", str(a.nproc), "-H", f"localhost:{a.nproc}", "--gloo", sys.executable, "-u", *target, *a.args]
    return run_horovodrun(cmd)
