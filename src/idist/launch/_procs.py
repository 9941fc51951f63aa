"""Process management for ``spawn``: start one process per local rank, watch all, fail fast.

The parent waits on every rank at once (each rank's process sentinel and its result
pipe, through ``multiprocessing.connection.wait``), never on one rank after another. The
first rank that raises, exits non-zero or is killed makes the parent stop the others
(SIGTERM to each rank's process group, then SIGKILL after a grace period) and raise
``LaunchError`` with that rank's number, exit code or signal name and traceback. Ctrl-C
(or any exception) in the parent while it waits stops every rank the same way. Ranks
watch their parent and exit if it dies. The rendezvous port is reserved by the parent
(``_ports``) until the launch ends, so two launches at once never collide.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import TracebackType
from typing import Any, Generic, Literal, TypeAlias, TypeVar, cast, final

import attrs

from .._errors import LaunchConfigError, LaunchError
from ._child import ChildSpec, child_main
from ._ports import LOOPBACK, PortReservation, reserve_port

R = TypeVar("R")
StartMethod: TypeAlias = Literal["spawn", "fork", "forkserver"]

#: Seconds the other ranks get to exit after SIGTERM before they are killed.
GRACE_SECONDS = 3.0

#: Per-rank variables from an enclosing launcher (torchrun, SLURM, OpenMPI, MPICH,
#: Horovod) that would contradict the rank the child is given; removed in the child.
INHERITED_RANK_VARS = (
    "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_ERROR_FILE",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_JOB_NODELIST", "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_HOSTNAME",
    "PJRT_LOCAL_PROCESS_RANK", "PJRT_LOCAL_PROCESS_COUNT",
)  # fmt: skip

NATIVE_SPAWNABLE = ("gloo", "nccl")


@attrs.frozen(kw_only=True)
class Topology:
    """Where this launch sits: ``nproc_per_node`` ranks on node ``node_rank`` of ``nnodes``."""

    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def rank(self, local_rank: int) -> int:
        return self.node_rank * self.nproc_per_node + local_rank

    def check(self) -> None:
        for name in ("nproc_per_node", "nnodes", "node_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise LaunchConfigError(f"{name} must be an int, got {value!r}")
        if self.nproc_per_node < 1:
            raise LaunchConfigError(f"nprocs/nproc_per_node must be at least 1, got {self.nproc_per_node}")
        if self.nnodes < 1:
            raise LaunchConfigError(f"nnodes must be at least 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise LaunchConfigError(
                f"node_rank={self.node_rank} is outside 0..{self.nnodes - 1} (nnodes={self.nnodes})"
            )
        port = self.master_port
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
            raise LaunchConfigError(f"master_port must be an int in 1..65535, got {port!r}")
        if self.nnodes > 1 and port is None:
            raise LaunchConfigError(
                f"nnodes={self.nnodes}: pass the same master_addr= and master_port= to the launch on every "
                "node (node_rank=0 hosts the rendezvous there); a port cannot be picked for you across machines"
            )


def _signal_name(exitcode: int) -> str | None:
    if exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


@attrs.define(eq=False)
class _Rank:
    local_rank: int
    rank: int
    process: BaseProcess
    conn: Connection | None
    message: tuple[Any, ...] | None = None
    exitcode: int | None = None

    @property
    def finished(self) -> bool:
        """Exited and reaped: from here on its pid may belong to another process."""
        return self.exitcode is not None

    def poll(self) -> int | None:
        # Every reap goes through here, so ``finished`` is exactly "reaped".
        if self.exitcode is None:
            self.exitcode = self.process.exitcode
        return self.exitcode


@attrs.frozen
class _Failure:
    rank: _Rank
    when: float
    summary: str
    exitcode: int | None
    traceback: str | None


@final
class SpawnHandle(Generic[R]):
    """The running ranks of one ``spawn(..., join=False)``.

    ``join()`` waits for all of them (raising ``LaunchError`` on the first failure, after
    stopping the rest); ``results`` are the return values in local-rank order;
    ``terminate()`` stops them all. As a context manager it joins on a clean exit and
    terminates on an exception.
    """

    def __init__(self, ranks: list[_Rank], reservation: PortReservation | None, topology: Topology) -> None:
        self._ranks = ranks
        self._reservation = reservation
        self.topology = topology
        self._error: LaunchError | None = None

    @property
    def processes(self) -> list[BaseProcess]:
        return [r.process for r in self._ranks]

    @property
    def pids(self) -> list[int]:
        return [r.process.pid for r in self._ranks if r.process.pid is not None]

    @property
    def master_port(self) -> int | None:
        return self.topology.master_port

    def done(self) -> bool:
        return all(r.finished for r in self._ranks)

    @property
    def results(self) -> list[R]:
        """Each local rank's return value, in local-rank order (after a successful join)."""
        if self._error is not None:
            raise self._error
        if not self.done():
            raise LaunchError("the ranks are still running: call join() first")
        return [cast(R, r.message[1] if r.message else None) for r in self._ranks]

    def join(self, timeout: float | None = None) -> bool:
        """Wait for every rank. True when all finished, False when ``timeout`` ran out.

        Raises ``LaunchError`` for the first rank that failed, after stopping the others;
        an exception here (Ctrl-C included) also stops every rank before propagating.
        """
        if self._error is not None:
            raise self._error
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self.done():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                failures = self._step(left)
                if failures:
                    first = min(failures, key=lambda f: f.when)
                    self._stop()
                    self._error = self._launch_error(first)
                    raise self._error
        except BaseException:
            self._stop()
            raise
        self._release()
        return True

    def _step(self, timeout: float | None) -> list[_Failure]:
        pending = [r for r in self._ranks if not r.finished]
        waitables: list[Any] = [r.conn for r in pending if r.conn is not None]
        waitables += [r.process.sentinel for r in pending]
        # A bounded wait also catches a rank whose sentinel is held open by its children.
        ready = set(wait(waitables, timeout=1.0 if timeout is None else min(timeout, 1.0)))
        now = time.time()
        failures: list[_Failure] = []
        for r in pending:
            if r.conn is not None and (r.conn in ready or r.process.sentinel in ready):
                self._read(r)
            if r.message is not None and r.message[0] == "error":
                _, summary, tb, when, code = r.message
                failures.append(_Failure(r, when, summary, code, tb))
                continue
            code = r.poll()
            if code is None:
                continue
            if r.conn is not None:
                self._read(r)
            if r.message is not None and r.message[0] == "error":
                _, summary, tb, when, intended = r.message
                failures.append(_Failure(r, when, summary, intended, tb))
            elif code != 0:
                sig = _signal_name(code)
                what = f"was killed by {sig}" if sig else f"exited with code {code}"
                if r.message is not None:
                    what += " after fn returned"
                failures.append(_Failure(r, now, what, code, None))
            elif r.message is None:
                failures.append(_Failure(r, now, "exited with code 0 before fn returned (os._exit?)", 0, None))
        return failures

    @staticmethod
    def _read(r: _Rank) -> None:
        conn = r.conn
        assert conn is not None
        try:
            while conn.poll(0):
                r.message = conn.recv()
        except (EOFError, OSError):
            conn.close()
            r.conn = None

    def _launch_error(self, f: _Failure) -> LaunchError:
        r = f.rank
        where = f"rank {r.rank} (local rank {r.local_rank}"
        where += f", node {self.topology.node_rank})" if self.topology.nnodes > 1 else ")"
        text = f"{where} failed: {f.summary}"
        if f.traceback:
            text += f"\n\n--- traceback of rank {r.rank} ---\n{f.traceback.rstrip()}"
        stopped = [o.rank for o in self._ranks if o is not r]
        if stopped:
            text += f"\n\nthe other ranks ({', '.join(map(str, stopped))}) were stopped"
        code = f.exitcode if f.exitcode is not None else r.exitcode
        return LaunchError(
            text, rank=r.rank, local_rank=r.local_rank, exitcode=code,
            signal_name=_signal_name(code) if code is not None else None, traceback=f.traceback,
        )  # fmt: skip

    def terminate(self) -> None:
        """Stop every rank still running (SIGTERM, then SIGKILL after a grace period)."""
        self._stop()

    def _signal(self, r: _Rank, sig: int) -> None:
        pid = r.process.pid
        if pid is None or r.finished:
            return  # never signal a reaped pid: it may belong to someone else now
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)  # the rank and whatever it started
            else:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _stop(self) -> None:
        alive = [r for r in self._ranks if r.poll() is None]
        for r in alive:
            self._signal(r, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_SECONDS
        while alive and time.monotonic() < deadline:
            wait([r.process.sentinel for r in alive], timeout=max(0.0, deadline - time.monotonic()))
            alive = [r for r in alive if r.poll() is None]
        for r in alive:
            self._signal(r, signal.SIGKILL)
        for r in self._ranks:
            r.process.join()
            r.poll()
            if r.conn is not None:
                r.conn.close()
                r.conn = None
        self._release()

    def _release(self) -> None:
        if self._reservation is not None:
            self._reservation.close()
        for r in self._ranks:
            if r.conn is not None:
                r.conn.close()
                r.conn = None

    def __enter__(self) -> SpawnHandle[R]:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if et is None:
            self.join()
        else:
            self._stop()

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"<SpawnHandle {len(self._ranks)} ranks {state} pids={self.pids}>"


def checked_args(fn: object, args: object) -> tuple[Any, ...]:
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


def start(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    topology: Topology,
    *,
    daemon: bool = False,
    start_method: str = "spawn",
    backend: str | None = None,
    init_kwargs: Mapping[str, Any] | None = None,
    rank_env: bool = True,
    extra_env: Mapping[str, str] | None = None,
) -> SpawnHandle[Any]:
    """Start ``topology.nproc_per_node`` ranks running ``fn``; see ``idist.spawn``.

    ``rank_env=False`` starts processes that are not ranks themselves (a launcher such as
    ``horovod.run`` inside them starts the ranks): no port is reserved and no RANK,
    MASTER_ADDR... is set for them. ``extra_env``: more variables for every process.
    """
    args = checked_args(fn, args)
    check_start_method(start_method)
    topology.check()
    reservation: PortReservation | None = None
    addr = topology.master_addr or LOOPBACK
    if rank_env and topology.master_port is None:
        reservation = reserve_port(addr)
        topology = attrs.evolve(topology, master_addr=addr, master_port=reservation.port)
    elif rank_env:
        topology = attrs.evolve(topology, master_addr=addr)
    ctx: Any = mp.get_context(start_method)
    ranks: list[_Rank] = []
    handle: SpawnHandle[Any] = SpawnHandle(ranks, reservation, topology)
    parent_pid = os.getpid() if start_method != "forkserver" else -1
    try:
        for local in range(topology.nproc_per_node):
            rank = topology.rank(local)
            env = {
                "RANK": str(rank),
                "LOCAL_RANK": str(local),
                "WORLD_SIZE": str(topology.world_size),
                "LOCAL_WORLD_SIZE": str(topology.nproc_per_node),
                "GROUP_RANK": str(topology.node_rank),
                "NNODES": str(topology.nnodes),
                "MASTER_ADDR": addr,
                "MASTER_PORT": str(topology.master_port),
            }
            env = {**(env if rank_env else {}), **(extra_env or {})}
            spec = ChildSpec(
                fn=fn, args=args, kwargs=dict(kwargs), local_rank=local, rank=rank, env=env,
                drop_env=INHERITED_RANK_VARS, parent_pid=parent_pid, backend=backend,
                init_kwargs=dict(init_kwargs or {}),
            )  # fmt: skip
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=child_main, args=(spec, writer), daemon=daemon, name=f"idist-rank-{rank}")
            try:
                proc.start()
            except Exception as e:
                reader.close()
                writer.close()
                hint = (
                    "with start_method='spawn', fn and args must be picklable: fn a module-level function "
                    "(not a lambda, closure or a function defined in `python -c`)"
                    if start_method != "fork" else "see the error above"
                )  # fmt: skip
                raise LaunchError(f"could not start rank {rank}: {type(e).__name__}: {e}; {hint}") from e
            writer.close()  # the child holds the only write end: EOF means it is gone
            ranks.append(_Rank(local, rank, proc, reader))
    except BaseException:
        handle._stop()
        raise
    return handle


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
