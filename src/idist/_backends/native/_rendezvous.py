"""Where the ranks meet: a store that listens only where peers reach it, a checked join, and
the interface gloo binds (loopback for one node, else the one that routes to the master).

torch's own choices listen on every interface (``TCPStore``) and bind gloo to the address
the hostname resolves to (127.0.1.1 on Debian, so other nodes are told to connect there).
The join step makes every rank claim its slot and wait for the others: a second job on the
same master port, or a node that never comes, fails typed and named instead of hanging.
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import attrs
from torch._C._distributed_c10d import Store, TCPStore

from ... import _environ, _netif
from ..._errors import LaunchEnvironmentError, RendezvousTimeoutError
from ..._launch_env import LaunchInfo
from ._keys import join_prefix
from ._tally import Tally

#: seconds the join waits for every rank unless the launcher says (IDIST_RDZV_TIMEOUT)
RDZV_TIMEOUT_VAR = "IDIST_RDZV_TIMEOUT"
#: how long a client probes for the store before torch's own (slower) retries take over
SERVER_WAIT = 10.0
_ENV_LOCK = threading.Lock()


def bind_for(info: LaunchInfo, master_addr: str | None) -> _netif.Bind:
    """The address (and interface) this rank's gloo device and store listen on."""
    try:
        return _netif.choose_bind(master_addr, nnodes=info.topology.nnodes, env=os.environ)
    except _netif.NetifError as e:
        raise LaunchEnvironmentError(str(e)) from e


def noted(info: LaunchInfo, bind: _netif.Bind) -> LaunchInfo:
    """``info`` with the interface choice in what decided the configuration (``show_config``)."""
    interface = f"{bind.address} on {bind.interface or 'an unknown interface'}: {bind.reason}"
    return attrs.evolve(info, decided_by={**info.decided_by, "interface": interface})


def tcp_store(addr: str, port: int, info: LaunchInfo, host: bool, timeout: datetime.timedelta) -> Store:
    """The job's store at ``addr:port``: served here (listening only on ``addr`` as it resolves
    on this machine) when ``host``, else a client of it."""
    world = info.topology.world_size
    if not host:
        _wait_for_server(addr, port, min(timeout.total_seconds(), SERVER_WAIT))
        return TCPStore(addr, port, world, False, timeout=timeout)
    try:
        local = _netif.store_address(addr)
        listen = _netif.listen(local, port)
    except _netif.NetifError as e:
        raise LaunchEnvironmentError(str(e)) from e
    except OSError as e:
        raise LaunchEnvironmentError(_netif.listen_error(local, port, e)) from e
    return TCPStore(
        addr,
        listen.getsockname()[1],
        world,
        True,
        timeout=timeout,
        master_listen_fd=listen.detach(),
        use_libuv=True,
        wait_for_workers=False,
    )


def _wait_for_server(addr: str, port: int, seconds: float) -> None:
    """Return once the store at ``addr:port`` accepts connections, or after ``seconds``.

    torch's client retries a refused connection only after a pause (about half a second
    here), which every rank that starts before rank 0's store listens would pay; probing
    every 10 ms costs a connection that the store drops at once.
    """
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((addr, port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() >= deadline:
                return  # torch's client takes over: it waits for the store and reports the failure
            time.sleep(0.01)


def join(store: Store, info: LaunchInfo, timeout: datetime.timedelta, where: str) -> None:
    """Claim this rank's slot, then wait until every rank has: ``RendezvousTimeoutError`` naming
    the ranks (and nodes) that did not come; ``LaunchEnvironmentError`` when the slot was taken.

    Four requests a rank, whatever the world's size (``Tally``): a claim, an arrival counted with
    ``add``, and one wait that the store answers when the count completes. Only on a timeout does
    one rank read who came, once, and post who did not."""
    t = info.topology
    seconds = float(os.environ.get(RDZV_TIMEOUT_VAR) or timeout.total_seconds())
    prefix = join_prefix(os.environ)
    if store.add(f"{prefix}/claim/{t.rank}", 1) != 1:
        raise LaunchEnvironmentError(
            f"rank {t.rank} already joined the rendezvous at {where}: another job uses this master address "
            "and port; give each job its own master_port"
        )
    tally = Tally(store, prefix, t.world_size)
    tally.arrive(t.rank)
    if not tally.block(seconds):
        missing = tally.missing(5.0)
        nodes = sorted({r // t.nproc_per_node for r in missing})
        raise RendezvousTimeoutError(
            f"rendezvous at {where}: ranks {missing} (node {', '.join(map(str, nodes))}) did not join within "
            f"{seconds:g}s; start them (same master address and port), or check that they can reach {where}"
        )


@contextmanager
def gloo_interface(bind: _netif.Bind) -> Iterator[None]:
    """Make torch's gloo constructor bind ``bind``'s interface for the block (it reads
    ``GLOO_SOCKET_IFNAME``); a value the user set is kept, and the variable restored after."""
    if bind.interface is None or _netif.GLOO_IFNAME_VAR in os.environ:
        yield
        return
    with _ENV_LOCK, _environ.changed({_netif.GLOO_IFNAME_VAR: bind.interface}):
        yield
