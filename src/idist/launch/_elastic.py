"""``idist run --nnodes MIN:MAX --max-restarts K``: the script under torch's elastic agent.

Each node runs a ``torch.distributed.elastic`` ``LocalElasticAgent``; the agents meet in a c10d
rendezvous at ``--master-addr:--master-port`` (``--rdzv-endpoint``), start ``-n`` ranks each,
and when a rank fails (a lost node ends its peers through idist's liveness) stop their ranks,
meet again with the nodes that remain (at least MIN; nodes that arrived join, up to MAX) and
start the script again, at most K times. idist adds the checks of the flags, each rank's
output prefixed with ``[rankN]:``, and one line per restart with its cause.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence

import attrs

from .. import _environ
from .._errors import LaunchConfigError
from .._rank_vars import INHERITED_RANK_VARS
from ._plan import MAX_WORLD_SIZE

#: seconds the rendezvous waits for more nodes (up to MAX) once MIN have joined (torch's default: 30)
LAST_CALL = 1.0
#: seconds between two looks of the agent at its ranks (torch's default: 5)
MONITOR = 0.1
#: what torch's agent handles while it runs (TORCHELASTIC_SIGNALS_TO_HANDLE's default)
_AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


@attrs.frozen
class ElasticPlan:
    """One node's part of an elastic job."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    max_restarts: int
    #: host:port of the c10d rendezvous (port 0 on loopback: one node, a free port)
    endpoint: str
    #: seconds the agents wait for MIN nodes at each rendezvous
    join_timeout: float


def node_range(text: str) -> tuple[int, int]:
    """``N`` or ``MIN:MAX`` (``--nnodes``), checked: ``LaunchConfigError`` says what to pass."""
    parts = text.split(":")
    try:
        low, high = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, -1)
    except ValueError:
        raise LaunchConfigError(f"--nnodes takes N or MIN:MAX (whole numbers), got {text!r}") from None
    if len(parts) > 2:
        raise LaunchConfigError(f"--nnodes takes N or MIN:MAX, got {text!r}")
    if low < 1 and len(parts) == 1:
        raise LaunchConfigError(f"--nnodes must be at least 1, got {text}")
    if low < 1:
        raise LaunchConfigError(f"--nnodes {text}: MIN must be at least 1 (the job goes on with MIN to MAX nodes)")
    if low > high:
        raise LaunchConfigError(f"--nnodes {text}: MIN ({low}) is more than MAX ({high}); pass MIN:MAX with MIN <= MAX")
    return low, high


def endpoint_of(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``--rdzv-endpoint``; ``[v6]:PORT`` for IPv6)."""
    host, sep, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LaunchConfigError(f"--rdzv-endpoint takes HOST:PORT with a port in 1..65535, got {text!r}")
    return host, int(port)


def plan(
    nodes: tuple[int, int],
    nproc: int,
    max_restarts: int | None,
    addr: str | None,
    port: int | None,
    rdzv_timeout: float | None,
) -> ElasticPlan:
    """The elastic launch the flags describe; ``LaunchConfigError`` for one that cannot work."""
    low, high = nodes
    restarts = 0 if max_restarts is None else max_restarts
    if restarts < 0:
        raise LaunchConfigError(f"--max-restarts must be 0 or more (restarts after a failure), got {restarts}")
    if nproc * high > MAX_WORLD_SIZE:
        raise LaunchConfigError(f"-n {nproc} x {high} nodes (--nnodes MAX) is more than {MAX_WORLD_SIZE} ranks")
    if port is None:
        if high > 1:
            raise LaunchConfigError(
                f"--nnodes {low}:{high}: pass the same rendezvous endpoint to every node: --master-addr and "
                "--master-port (or --rdzv-endpoint HOST:PORT); the node that owns that address hosts it"
            )
        addr, port = addr or "127.0.0.1", 0
    host = f"[{addr}]" if addr and ":" in addr else (addr or "127.0.0.1")
    return ElasticPlan(low, high, nproc, restarts, f"{host}:{port}", 600.0 if rdzv_timeout is None else rdzv_timeout)


@contextlib.contextmanager
def agent_scope(extra_env: Mapping[str, str], launcher: str) -> Iterator[str]:
    """The agent's surroundings in this process, all given back after: a folder for the ranks' logs
    (yielded), this environment less an enclosing launcher's rank variables (the agent starts the
    ranks with it), and the signal handlers that torch's agent replaces with its own."""
    main = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in _AGENT_SIGNALS} if main else {}
    logs = tempfile.mkdtemp(prefix="idist-elastic-")
    try:
        with _environ.kept():
            _environ.apply({**dict.fromkeys(INHERITED_RANK_VARS), **extra_env, "IDIST_LAUNCHER": launcher})
            yield logs
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        shutil.rmtree(logs, ignore_errors=True)


def run(p: ElasticPlan, target: Sequence[str], extra_env: Mapping[str, str]) -> int:
    """Run ``python -u *target`` under the elastic agent on this node; the launcher's exit status."""
    from ._agent import run_agent  # deferred: torch.distributed.elastic is imported only for elastic jobs

    with agent_scope(extra_env, "idist run") as logs:
        return run_agent(p, sys.executable, ("-u", *target), logs, LAST_CALL, MONITOR).code
