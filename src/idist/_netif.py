"""Which local address and interface a rank binds: loopback for one node, else the one that reaches the master.

torch's own choice is the address the machine's *hostname* resolves to (127.0.1.1 on Debian,
so other nodes are told to connect there), and a TCPStore server listens on every interface.
``choose_bind(master_addr, nnodes=..., env=os.environ)`` answers instead: ``GLOO_SOCKET_IFNAME``
when set; loopback for one node whose master is local; else the source address the kernel
uses to reach ``master_addr`` (a UDP ``connect()``, nothing sent) and its interface, or, where
the master resolves to loopback here, the machine's only other interface. Standard library
only; see docs/multinode.md.
"""

from __future__ import annotations

import array
import errno
import ipaddress
import socket
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Final, final

import attrs

LOOPBACK4: Final = "127.0.0.1"
GLOO_IFNAME_VAR: Final = "GLOO_SOCKET_IFNAME"
_SIOCGIFCONF: Final = 0x8912
#: any port: connect() on a UDP socket only asks the kernel for a route
_PROBE_PORT: Final = 9


class NetifError(OSError):
    """No usable address: an unknown interface, an unresolvable or unreachable master."""


@final
@attrs.frozen
class Bind:
    """Where this rank's gloo device and (on the store host) the TCPStore should listen."""

    #: the local IP address to bind (and advertise to peers)
    address: str
    #: the interface holding ``address`` (None where it cannot be told)
    interface: str | None
    #: why, for ``show_config`` / ``idist info``
    reason: str

    @property
    def loopback(self) -> bool:
        return is_loopback_address(self.address)

    def gloo_env(self) -> dict[str, str]:
        """The variable a launcher sets for ranks it starts (empty if the interface is unknown)."""
        return {GLOO_IFNAME_VAR: self.interface} if self.interface else {}


def is_loopback_address(addr: str) -> bool:
    """True for an IP literal in 127.0.0.0/8 or ::1 (also IPv4-mapped); False for anything else."""
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def resolve(host: str) -> list[str]:
    """The IP addresses ``host`` resolves to here (IPv4 first, no duplicates); NetifError if none."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise NetifError(f"cannot resolve {host!r}: {e}") from e
    seen: dict[str, int] = {}
    for family, _, _, _, sockaddr in infos:
        seen.setdefault(str(sockaddr[0]), 0 if family == socket.AF_INET else 1)
    return sorted(seen, key=lambda a: seen[a])


def is_loopback(host: str) -> bool:
    """True if ``host`` (a name or an address) resolves only to loopback addresses here."""
    if host == "localhost" or is_loopback_address(host):
        return True
    try:
        return all(is_loopback_address(a) for a in resolve(host))
    except NetifError:
        return False


def _ipv4_addresses() -> list[tuple[str, str]]:
    """(interface, address) for every IPv4 address (SIOCGIFCONF, Linux layout); [] if unsupported."""
    import fcntl  # POSIX only: where it is missing, interface names are simply unknown

    ifreq = 40 if struct.calcsize("P") == 8 else 32
    size = ifreq * 256
    buf = array.array("B", bytes(size))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFCONF, struct.pack("iL", size, buf.buffer_info()[0]))
    except OSError:
        return []
    used = struct.unpack("iL", packed)[0]
    raw = buf.tobytes()
    out = []
    for off in range(0, used, ifreq):
        name = raw[off : off + 16].split(b"\0", 1)[0].decode(errors="replace").split(":", 1)[0]
        out.append((name, socket.inet_ntoa(raw[off + 20 : off + 24])))
    return out


def _ipv6_addresses() -> list[tuple[str, str]]:
    """(interface, address) from /proc/net/if_inet6; [] where it does not exist."""
    try:
        lines = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 6:
            out.append((parts[5], str(ipaddress.IPv6Address(bytes.fromhex(parts[0])))))
    return out


def interface_addresses() -> dict[str, list[str]]:
    """Every interface's IP addresses (IPv4 first), e.g. ``{"lo": ["127.0.0.1", "::1"], "eth0": [...]}``."""
    found: dict[str, list[str]] = {}
    try:
        for _, name in socket.if_nameindex():
            found[name] = []
    except OSError:
        pass
    for name, addr in _ipv4_addresses() + _ipv6_addresses():
        found.setdefault(name, []).append(addr)
    return found


def interface_of(addr: str) -> str | None:
    """The interface that holds ``addr`` here, or None."""
    want = ipaddress.ip_address(addr.split("%", 1)[0])
    for name, addrs in interface_addresses().items():
        if any(ipaddress.ip_address(a) == want for a in addrs):
            return name
    return None


def route_to(host: str) -> Bind:
    """The local address (and its interface) the kernel uses to reach ``host``; sends nothing."""
    addrs = resolve(host)
    errors = []
    for addr in addrs:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            try:
                s.connect((addr, _PROBE_PORT))
            except OSError as e:
                errors.append(f"{addr}: {e.strerror or e}")
                continue
            local = str(s.getsockname()[0])
        shown = host if host == addr else f"{host} ({addr})"
        iface = interface_of(local)
        return Bind(local, iface, f"routes to {shown} via {iface or 'an unknown interface'}")
    raise NetifError(f"no route from this machine to {host!r}: {'; '.join(errors)}")


def _loopback() -> Bind:
    return Bind(LOOPBACK4, interface_of(LOOPBACK4), "one node: loopback only")


def _routable(addr: str) -> bool:
    """Neither loopback nor link-local: an address another machine could be told to connect to."""
    return not is_loopback_address(addr) and not ipaddress.ip_address(addr.split("%", 1)[0]).is_link_local


def _is_local(host: str) -> bool:
    try:
        addrs = resolve(host)
    except NetifError:
        return False
    mine = {a for v in interface_addresses().values() for a in v}
    return all(is_loopback_address(a) or a in mine for a in addrs)


def store_address(master_addr: str | None) -> str:
    """The address the store host (rank 0 / node 0) listens on: ``master_addr`` as it resolves here,
    since that is what every client connects to (loopback when None). ``NetifError`` if it is not an
    address of this machine."""
    if master_addr is None:
        return LOOPBACK4
    addrs = resolve(master_addr)
    mine = {a for v in interface_addresses().values() for a in v}
    for addr in addrs:
        if is_loopback_address(addr) or addr in mine:
            return addr
    raise NetifError(
        f"{master_addr!r} ({', '.join(addrs)}) is not an address of this machine, so the rendezvous store "
        "cannot listen on it: run node rank 0 on the machine that master_addr names"
    )


def family(addr: str) -> socket.AddressFamily:
    """The socket family of an IP literal: IPv6 for ``::1``, ``fe80::1%eth0``..., IPv4 otherwise."""
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def listen(addr: str, port: int) -> socket.socket:
    """A TCP socket listening on ``addr:port`` (an IP literal, IPv4 or IPv6); ``OSError`` as the
    kernel gives it (see ``listen_error`` for what to tell the user)."""
    return socket.create_server((addr, port), family=family(addr))


def listen_error(addr: str, port: int, exc: OSError) -> str:
    """What went wrong when listening on ``addr:port`` failed with ``exc``, and what to do."""
    where = f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"
    reason = exc.strerror or str(exc)
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot serve the rendezvous store on {where} ({reason}): another job may use this master port; give "
            "each job its own (or pass none: a free one is picked on one node)"
        )
    return f"cannot serve the rendezvous store on {where} ({reason}): pass an address of this machine as master_addr"


def choose_bind(master_addr: str | None, *, nnodes: int, env: Mapping[str, str]) -> Bind:
    """Where gloo and the store bind for a job of ``nnodes`` nodes rendezvousing at ``master_addr``.

    Raises ``NetifError`` (an ``OSError``) when the choice cannot be made: an unknown
    ``GLOO_SOCKET_IFNAME``, an unresolvable or unreachable master, or a master that
    resolves to loopback on a multi-node job where this machine has several addresses.
    """
    override = env.get(GLOO_IFNAME_VAR, "").split(",")[0].strip()
    if override:
        table = interface_addresses()
        if not table.get(override):
            known = "; ".join(f"{n} {', '.join(a)}" for n, a in table.items() if a) or "none found"
            raise NetifError(f"{GLOO_IFNAME_VAR}={override}: no such interface with an address here ({known})")
        return Bind(table[override][0], override, f"{GLOO_IFNAME_VAR}={override}")
    if master_addr is None or (nnodes == 1 and _is_local(master_addr)):
        return _loopback()
    bind = route_to(master_addr)
    if not bind.loopback or nnodes == 1:
        return bind
    outside = {n: kept for n, addrs in interface_addresses().items() if (kept := [a for a in addrs if _routable(a)])}
    if len(outside) == 1:
        [(name, kept)] = outside.items()
        return Bind(kept[0], name, f"{master_addr} resolves to loopback here; the only other interface is {name}")
    listed = ", ".join(f"{n} ({', '.join(a)})" for n, a in outside.items()) or "none"
    raise NetifError(
        f"{master_addr!r} resolves to a loopback address ({resolve(master_addr)[0]}) on this node, so the other "
        f"{nnodes - 1} node(s) could not reach what binds here; pass an address of this machine that they "
        f"can reach as master_addr, or set {GLOO_IFNAME_VAR} to one of: {listed}"
    )
