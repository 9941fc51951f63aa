"""idist._netif on this machine: loopback cases only (no name lookups beyond /etc/hosts' localhost, no
traffic). The multi-node cases run inside network namespaces: tests/netns/test_netns_netif.py."""

from __future__ import annotations

import pytest

from idist import _netif
from idist._netif import Bind, NetifError, choose_bind, is_loopback, is_loopback_address, store_address


@pytest.mark.parametrize(
    ("addr", "expected"),
    [
        ("127.0.0.1", True), ("127.0.1.1", True), ("127.255.255.254", True), ("::1", True),
        ("::ffff:127.0.0.1", True), ("10.0.0.1", False), ("0.0.0.0", False), ("::", False),
        ("fe80::1%eth0", False), ("localhost", False), ("not an address", False),
    ],
)  # fmt: skip
def test_is_loopback_address_takes_literals_only(addr: str, expected: bool) -> None:
    assert is_loopback_address(addr) is expected


def test_is_loopback_resolves_names() -> None:
    assert is_loopback("localhost")
    assert is_loopback("127.0.1.1")
    assert not is_loopback("192.0.2.7")  # a literal: no lookup


def test_the_loopback_interface_is_found() -> None:
    table = _netif.interface_addresses()
    lo = _netif.interface_of("127.0.0.1")
    assert lo is not None and "127.0.0.1" in table[lo]
    assert _netif.route_to("127.0.0.1") == Bind("127.0.0.1", lo, "routes to 127.0.0.1 via " + lo)


@pytest.mark.parametrize("master", [None, "127.0.0.1", "localhost"])
def test_one_node_binds_loopback(master: str | None) -> None:
    bind = choose_bind(master, nnodes=1, env={})
    assert bind.address == "127.0.0.1" and bind.loopback
    assert bind.interface == _netif.interface_of("127.0.0.1")
    assert "loopback" in bind.reason


def test_gloo_socket_ifname_overrides() -> None:
    lo = _netif.interface_of("127.0.0.1")
    assert lo is not None
    bind = choose_bind("192.0.2.7", nnodes=4, env={"GLOO_SOCKET_IFNAME": f"{lo},other"})
    assert bind == Bind("127.0.0.1", lo, f"GLOO_SOCKET_IFNAME={lo}")
    assert bind.gloo_env() == {"GLOO_SOCKET_IFNAME": lo}


def test_unknown_interface_is_an_error_listing_the_real_ones() -> None:
    with pytest.raises(NetifError, match=r"GLOO_SOCKET_IFNAME=nosuch0: no such interface.*127\.0\.0\.1") as e:
        choose_bind(None, nnodes=1, env={"GLOO_SOCKET_IFNAME": "nosuch0"})
    assert isinstance(e.value, OSError)


def test_store_address() -> None:
    assert store_address(None) == "127.0.0.1"
    assert store_address("localhost") == "127.0.0.1"
    assert store_address("127.0.0.1") == "127.0.0.1"
    with pytest.raises(NetifError, match="not an address of this machine"):
        store_address("192.0.2.7")  # TEST-NET-1: never local
