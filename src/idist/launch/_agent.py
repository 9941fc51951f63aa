"""torch's ``LocalElasticAgent`` with a c10d rendezvous, telling the user why it restarts.

The agent is torch's own; ``_Agent`` only watches what it does: each failure of this node's
ranks (the first rank to fail, its exit status or signal, the last line it wrote to stderr)
is printed when the agent restarts for it, a restart for nodes waiting to join says so, and a
job that runs out of restarts lists every cause before its non-zero exit status.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, ProcessFailure, SignalException, Std
from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousParameters
from torch.distributed.elastic.rendezvous import registry as rdzv_registry

from .. import _netif
from .._errors import LaunchError, PeerLostError
from ._ports import PortReservation

if TYPE_CHECKING:
    from ._elastic import ElasticPlan

_FAILED = (WorkerState.FAILED, WorkerState.UNHEALTHY)
#: seconds the ranks still running may take to exit by themselves, when every rank out so far ended
#: only because it lost a peer (the cause is still exiting), before torch's agent stops them
SETTLE = 5.0
_SETTLE_POLL = 0.05
#: seconds between an agent's heartbeats in the rendezvous, and how many it may miss (torch: 5 s, 3)
KEEP_ALIVE = 1
KEEP_ALIVE_MISSED = 10


def _say(line: str) -> None:
    print(f"idist: {line}", file=sys.stderr, flush=True)


def _last_line(path: object) -> str:
    if not isinstance(path, str):
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:500] if lines else ""


def _lost_peer(said: str) -> bool:
    """Whether a rank's last word says it ended only because a peer was lost: a consequence of
    another rank's failure, never the cause to report."""
    return PeerLostError.__name__ in said


def _exit_status(pid: int) -> int | None:
    """A child's exit status (negative: the signal) without reaping it (torch's agent reaps it
    later); None while it runs, 0 once reaped (torch's agent reaps only the ranks that succeeded)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return 0
    if info is None or info.si_pid == 0:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _recorded(failure: ProcessFailure) -> str:
    """The exception a function rank raised, as torch's error file recorded it ("" for a script)."""
    message: object = failure.error_file_data.get("message") if failure.error_file_data else None
    if isinstance(message, dict):
        message = message.get("message")  # pyright: ignore[reportUnknownMemberType]
    text = message.strip() if isinstance(message, str) else ""
    return text.splitlines()[-1][:500] if text and text != "<NONE>" else ""  # torch's "<NONE>": no file


class _Agent(LocalElasticAgent):
    """torch's agent; it reports each restart's cause (``causes`` keeps them)."""

    def __init__(self, spec: WorkerSpec, logs: DefaultLogsSpecs) -> None:
        super().__init__(spec=spec, logs_specs=logs, start_method="spawn", log_line_prefix_template="[rank${rank}]:")
        self.causes: list[str] = []
        self.exitcode = 1
        self.failed: tuple[int, int] | None = None
        self._healthy = False
        self._held: PortReservation | None = None

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        """torch's round, then, on the node whose rank 0 serves the ranks' store, that port held until
        the next round (``_ports``): torch only found it free, and rank 0 binds it seconds later,
        after importing torch, while any outgoing connection on the machine could take it."""
        self.release_port()
        super()._rendezvous(worker_group)
        if worker_group.group_rank == 0 and worker_group.master_port:
            try:
                self._held = PortReservation("0.0.0.0", worker_group.master_port)
            except LaunchError:
                pass  # taken already: rank 0 says so, naming the port

    def release_port(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None

    def _said(self, failure: ProcessFailure) -> str:
        ctx = self._pcontext
        return _recorded(failure) or (_last_line(ctx.stderrs.get(failure.local_rank)) if ctx is not None else "")

    def _cause(self, group: WorkerGroup, result: RunResult) -> str:
        # The first rank to fail; a rank that lost its peer is a consequence, named last: a rank that raised
        # can take longer to exit than its peers' liveness limit (seen across namespaces), and a script's
        # failures seen in one look carry the same timestamp (the time of the look).
        told = {r: self._said(f) for r, f in result.failures.items()}
        rank, failure = min(result.failures.items(), key=lambda kv: (_lost_peer(told[kv[0]]), kv[1].timestamp))
        code = failure.exitcode
        how = f"killed by {failure.signal_name()}" if code < 0 else f"exited with status {code}"
        self.exitcode = 128 - code if code < 0 else (code or 1)
        self.failed = (rank, code)
        said = told[rank]
        others = len(result.failures) - 1
        more = f" (and {others} more rank{'s' if others > 1 else ''} of this node)" if others else ""
        return f"rank {rank} (local rank {failure.local_rank} on node {group.group_rank}) {how}{more}" + (
            f": {said}" if said else ""
        )

    def _settle(self) -> None:
        """Let the ranks that fail together exit by themselves before torch's agent stops the rest:
        when every rank out so far failed only because it lost a peer, the rank that caused it
        may still be exiting (a process's exit can take seconds under load). Stopped with SIGTERM, it
        would be named "killed by SIGTERM" and the job would exit 143 instead of with its status."""
        ctx = self._pcontext
        deadline = time.monotonic() + SETTLE
        while ctx is not None and time.monotonic() < deadline:
            status = {lr: _exit_status(pid) for lr, pid in ctx.pids().items()}
            failed = [lr for lr, code in status.items() if code]
            if None not in status.values() or not failed:
                return
            if not all(_lost_peer(_last_line(ctx.stderrs.get(lr))) for lr in failed):
                return
            time.sleep(_SETTLE_POLL)

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        self._settle()
        result: RunResult = super()._monitor_workers(worker_group)
        self._healthy = result.state == WorkerState.HEALTHY
        if result.state in _FAILED and result.failures:
            cause = self._cause(worker_group, result)
            self.causes.append(cause)
            left, most = self._remaining_restarts, worker_group.spec.max_restarts
            if left > 0:
                _say(f"restart {most - left + 1} of {most}: {cause}")
        return result

    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        if self._healthy:  # the agent restarts healthy ranks only for nodes waiting to join
            _say(f"restarting on node {worker_group.group_rank}: a node joins (this does not count as a restart)")
        super()._restart_workers(worker_group)


@attrs.frozen
class Outcome:
    """How this node's agent ended: the exit status, each failure's cause, this node's return values."""

    code: int
    causes: list[str]
    #: local rank -> what the function returned (callable entrypoints; empty for a command)
    returns: dict[int, object]
    #: the last failure's first rank and its exit status (negative: the signal); None when none failed
    failed: tuple[int, int] | None = None
    stopped_by: int | None = None


def rendezvous_params(p: ElasticPlan, last_call: float) -> RendezvousParameters:
    """The c10d rendezvous every node's agent joins at ``p.endpoint``.

    An agent that stops beating for ``KEEP_ALIVE * KEEP_ALIVE_MISSED`` seconds is dropped from the
    round: its node is lost. Three beats (3 s) were too few: on a loaded machine a running agent
    missed them, and a node that came to join then started a round of its own beside the job.
    """
    local_addr = _netif.route_to(p.endpoint.rpartition(":")[0].strip("[]")).address
    return RendezvousParameters(
        backend="c10d",
        endpoint=p.endpoint,
        run_id="idist",
        min_nodes=p.min_nodes,
        max_nodes=p.max_nodes,
        join_timeout=p.join_timeout,
        last_call_timeout=last_call,
        close_timeout=10.0,
        local_addr=local_addr,
        keep_alive_interval=KEEP_ALIVE,
        keep_alive_max_attempt=KEEP_ALIVE_MISSED,
    )


def run_agent(
    p: ElasticPlan,
    entrypoint: str | Callable[..., object],
    args: tuple[object, ...],
    logs: str,
    last_call: float,
    monitor: float,
) -> Outcome:
    """Run this node's agent until the job ends (``entrypoint(*args)`` in each rank).

    Each round's rank 0 gives the ranks a fresh MASTER_ADDR:MASTER_PORT (its address as the route to
    the endpoint shows it) where idist's rank 0 serves the store. torch's default, one store the
    agents share across rounds, leaves a node that joins a later round waiting for an address
    the first round's host never publishes again (torch 2.13): it is turned off.
    """
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # the caller restores the environment
    params = rendezvous_params(p, last_call)
    spec = WorkerSpec(
        role="idist",
        local_world_size=p.nproc_per_node,
        entrypoint=entrypoint,
        args=args,
        rdzv_handler=rdzv_registry.get_rendezvous_handler(params),
        max_restarts=p.max_restarts,
        monitor_interval=monitor,
    )
    agent = _Agent(spec, DefaultLogsSpecs(log_dir=logs, tee=Std.ALL))
    shutdown = True
    try:
        result = agent.run()
    except RendezvousError as exc:
        _say(f"error: the rendezvous at {p.endpoint} failed: {exc}")
        return Outcome(1, [*agent.causes, f"the rendezvous at {p.endpoint} failed: {exc}"], {})
    except SignalException as exc:  # torch's agent stopped its ranks; it leaves the rendezvous open for the rest
        shutdown = False
        _say(f"stopped by {exc.sigval.name}")
        return Outcome(128 + int(exc.sigval), agent.causes, {}, stopped_by=int(exc.sigval))
    finally:
        agent.release_port()
        if shutdown:
            spec.rdzv_handler.shutdown()
    if not result.is_failed():
        base = min(result.return_values, default=0)
        return Outcome(0, agent.causes, {r - base: v for r, v in result.return_values.items()})
    listed = "; ".join(f"{i + 1}) {c}" for i, c in enumerate(agent.causes))
    _say(f"the job failed after {len(agent.causes) - 1} of {p.max_restarts} restarts; each failure: {listed}")
    return Outcome(agent.exitcode, agent.causes, {}, failed=agent.failed)
