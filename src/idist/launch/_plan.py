"""What a launch starts (``LaunchPlan``), and the checks of ``spawn``'s arguments."""

from __future__ import annotations

import multiprocessing as mp
from typing import Literal, TypeAlias

import attrs

from .._errors import LaunchConfigError
from .._topology import Topology

StartMethod: TypeAlias = Literal["spawn", "fork", "forkserver"]

NATIVE_SPAWNABLE = ("gloo", "nccl")
#: the most ranks one launch starts on one node: more is a typo (a machine starts far fewer usefully)
MAX_LOCAL_RANKS = 1024
#: the most ranks of one world (torch numbers them with 32-bit integers)
MAX_WORLD_SIZE = 2**31 - 1


@attrs.frozen(kw_only=True)
class LaunchPlan:
    """What one launch starts: ``nproc_per_node`` ranks on node ``node_rank`` of ``nnodes``,
    meeting at ``master_addr:master_port`` (or through ``init_method``, a ``file://`` URL);
    ``topology(local_rank)`` is where each rank sits."""

    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    init_method: str | None = None

    @classmethod
    def from_arguments(
        cls,
        nproc_per_node: object,
        nnodes: object = None,
        node_rank: object = None,
        master_addr: str | None = None,
        master_port: object = None,
        init_method: str | None = None,
    ) -> LaunchPlan:
        """The plan for ``spawn``/``Parallel``'s arguments, ignite's forms included (``None``
        means the default, ``master_port`` may be a string of digits); checked."""
        n_nodes = 1 if nnodes is None else _int_arg("nnodes", nnodes)
        if node_rank is None and n_nodes > 1:
            raise LaunchConfigError(
                f"nnodes={n_nodes}: pass node_rank= too (this node's index, 0..{n_nodes - 1}); "
                "every node runs the launch with its own node_rank"
            )
        if init_method is not None and init_method.startswith("tcp://"):
            raise LaunchConfigError(
                f"init_method={init_method!r} cannot serve ranks spawned here: each spawned rank would need that "
                "address to itself. Pass master_addr= and master_port= (or init_method='file:///shared/path')"
            )
        plan = cls(
            nproc_per_node=_int_arg("nproc_per_node", nproc_per_node),
            nnodes=n_nodes,
            node_rank=0 if node_rank is None else _int_arg("node_rank", node_rank),
            master_addr=master_addr,
            master_port=port_number(master_port),
            init_method=init_method,
        )
        plan.check()
        return plan

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def rank(self, local_rank: int) -> int:
        return self.node_rank * self.nproc_per_node + local_rank

    def topology(self, local_rank: int) -> Topology:
        return Topology(
            rank=self.rank(local_rank),
            world_size=self.world_size,
            local_rank=local_rank,
            nproc_per_node=self.nproc_per_node,
            node_rank=self.node_rank,
            nnodes=self.nnodes,
        )

    def check(self) -> None:
        for name in ("nproc_per_node", "nnodes", "node_rank"):
            _int_arg(name, getattr(self, name))
        if self.nproc_per_node < 1:
            raise LaunchConfigError(f"nprocs/nproc_per_node must be at least 1, got {self.nproc_per_node}")
        if self.nproc_per_node > MAX_LOCAL_RANKS:
            raise LaunchConfigError(
                f"nprocs/nproc_per_node={self.nproc_per_node} is more than {MAX_LOCAL_RANKS} processes on one "
                "node; pass the number of ranks this node should run"
            )
        if self.nnodes < 1:
            raise LaunchConfigError(f"nnodes must be at least 1, got {self.nnodes}")
        if self.world_size > MAX_WORLD_SIZE:
            raise LaunchConfigError(f"nprocs x nnodes = {self.world_size} ranks is more than {MAX_WORLD_SIZE}")
        if not 0 <= self.node_rank < self.nnodes:
            raise LaunchConfigError(
                f"node_rank={self.node_rank} is outside 0..{self.nnodes - 1} (nnodes={self.nnodes})"
            )
        port_number(self.master_port)
        shared_file = self.init_method is not None and not self.init_method.startswith("env://")
        if self.nnodes > 1 and self.master_port is None and not shared_file:
            raise LaunchConfigError(
                f"nnodes={self.nnodes}: pass the same master_addr= and master_port= to the launch on every "
                "node (node_rank=0 hosts the rendezvous there); a port cannot be picked for you across machines"
            )


def _int_arg(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LaunchConfigError(f"{name} must be an int, got {value!r}")
    return value


def port_number(port: object) -> int | None:
    """A rendezvous port as an int: an int or a string of digits (argparse gives strings) in 1..65535."""
    if port is None:
        return None
    value = int(port) if isinstance(port, str) and port.strip().isdigit() else port
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise LaunchConfigError(f"master_port must be an int in 1..65535, got {port!r}")
    return value


def checked_args(fn: object, args: object) -> tuple[object, ...]:
    """``args`` as a tuple, or ``LaunchConfigError`` when ``fn`` or ``args`` cannot work."""
    if not callable(fn):
        raise LaunchConfigError(f"fn must be callable, got {fn!r}")
    if isinstance(args, list):
        return tuple(args)
    if not isinstance(args, tuple):
        raise LaunchConfigError(f"args must be a tuple of positional arguments for fn, got {args!r}")
    return args


def check_start_method(start_method: str) -> None:
    """``LaunchConfigError`` when this platform's multiprocessing lacks ``start_method``."""
    if start_method not in mp.get_all_start_methods():
        raise LaunchConfigError(
            f"start_method={start_method!r} is not available here; use one of {', '.join(mp.get_all_start_methods())}"
        )


#: backends whose own launcher starts the ranks (``_driven``): horovod.run, torch_xla.launch
DRIVEN_SPAWNABLE = ("horovod", "xla-tpu")


def normalize_backend(backend: str) -> str:
    """The backend ignite's form may spawn, or ``LaunchConfigError`` saying what to do."""
    if backend in NATIVE_SPAWNABLE or backend in DRIVEN_SPAWNABLE:
        return backend
    if backend == "mpi":
        raise LaunchConfigError("the mpi backend is started by mpirun, not spawned: `mpirun -n N python script.py`")
    raise LaunchConfigError(
        f"spawn cannot start backend {backend!r}; use one of {', '.join(NATIVE_SPAWNABLE + DRIVEN_SPAWNABLE)}"
    )
