"""Rendezvous ports that two launches on one machine never share.

``reserve_port(addr)`` binds a socket to a free port (the kernel picks it) and keeps it
bound, with ``SO_REUSEADDR``, until the launch ends. While it is held, the kernel hands
that port to no other ``bind(port 0)`` on the machine, yet rank 0's TCPStore (which also
sets ``SO_REUSEADDR``, and listens) can still bind it. So there is no window between
"found a free port" and "rank 0 listens on it" in which another job can take it, and no
fixed default port at all.
"""

from __future__ import annotations

import socket
from types import TracebackType
from typing import final

from .._errors import LaunchError

LOOPBACK = "127.0.0.1"


@final
class PortReservation:
    """A bound, not listening socket holding ``port`` for one launch; close to release."""

    def __init__(self, addr: str = LOOPBACK, port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((addr, port))
        except OSError as e:
            sock.close()
            raise LaunchError(
                f"cannot reserve a rendezvous port on {addr!r} ({e}); pass master_addr= an address "
                "of this machine, or master_port= a port you know is free"
            ) from e
        self._sock: socket.socket | None = sock
        self.addr = addr
        self.port = int(sock.getsockname()[1])

    def close(self) -> None:
        """Release the port (idempotent)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    @property
    def held(self) -> bool:
        return self._sock is not None

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PortReservation({self.addr}:{self.port}, held={self.held})"


def reserve_port(addr: str = LOOPBACK) -> PortReservation:
    """Reserve a free TCP port on ``addr`` until the returned object is closed."""
    return PortReservation(addr)
