"""idist._netif inside the nodes: the address that reaches the master, hostnames that resolve to
loopback, an unreachable master, an ambiguous machine. Runs _netif.py by path (no torch import)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from netns_harness import NodeNet

NETIF = Path(__file__).resolve().parents[2] / "src" / "idist" / "_netif.py"

PROBE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("_netif", sys.argv[1])
n = importlib.util.module_from_spec(spec); sys.modules["_netif"] = n; spec.loader.exec_module(n)
out = {}
for name, call in json.loads(sys.argv[2]).items():
    fn, args, kwargs = call
    try:
        r = getattr(n, fn)(*args, **kwargs)
        out[name] = [r.address, r.interface] if isinstance(r, n.Bind) else r
    except n.NetifError as e:
        out[name] = "NetifError: " + str(e)
print(json.dumps(out))
"""


def _probe(nodes: NodeNet, i: int, calls: dict[str, Any]) -> dict[str, Any]:
    r = nodes.run(i, [sys.executable, "-c", PROBE, str(NETIF), json.dumps(calls)])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_netif_inside_nodes(nodes: NodeNet) -> None:
    n0, n1 = nodes.nodes
    for i in range(2):
        nodes.hostname_resolves_to(i, "127.0.1.1")
    got = _probe(nodes, 1, {
        "route": ["route_to", [n0.addr], {}],
        "by_addr": ["choose_bind", [n0.addr], {"nnodes": 2, "env": {}}],
        "by_name": ["choose_bind", ["node0"], {"nnodes": 2, "env": {}}],
        "single": ["choose_bind", [None], {"nnodes": 1, "env": {}}],
        "override": ["choose_bind", [n0.addr], {"nnodes": 2, "env": {"GLOO_SOCKET_IFNAME": "lo"}}],
        "me_loopback": ["is_loopback", ["node1"], {}],
        "peer_loopback": ["is_loopback", ["node0"], {}],
        "store_elsewhere": ["store_address", ["node0"], {}],
        "no_route": ["choose_bind", ["192.0.2.1"], {"nnodes": 2, "env": {}}],
        "no_name": ["choose_bind", ["nosuchhost.invalid"], {"nnodes": 2, "env": {}}],
    })  # fmt: skip
    assert got["route"] == got["by_addr"] == got["by_name"] == [n1.addr, "eth0"]
    assert got["single"] == ["127.0.0.1", "lo"]
    assert got["override"] == ["127.0.0.1", "lo"]
    assert got["me_loopback"] is True and got["peer_loopback"] is False
    assert got["store_elsewhere"].startswith("NetifError: 'node0'") and "not an address of this machine" in got[
        "store_elsewhere"]  # fmt: skip
    assert got["no_route"].startswith("NetifError: no route from this machine to '192.0.2.1'"), got["no_route"]
    assert got["no_name"].startswith("NetifError: cannot resolve 'nosuchhost.invalid'"), got["no_name"]

    # node 0 is the master; its own name resolves to 127.0.1.1 there (torchrun's c10d exports the name)
    calls = {
        "own_name": ["choose_bind", ["node0"], {"nnodes": 2, "env": {}}],
        "own_addr": ["choose_bind", [n0.addr], {"nnodes": 2, "env": {}}],
        "store": ["store_address", [n0.addr], {}],
        "store_name": ["store_address", ["node0"], {}],
        "one_node_own_addr": ["choose_bind", [n0.addr], {"nnodes": 1, "env": {}}],
    }
    got = _probe(nodes, 0, calls)
    assert got["own_name"] == got["own_addr"] == [n0.addr, "eth0"]
    assert got["store"] == n0.addr and got["store_name"] == "127.0.1.1"
    assert got["one_node_own_addr"] == ["127.0.0.1", "lo"]

    # a second interface makes "the only other interface" ambiguous: an error listing both
    for cmd in (["link", "add", "extra0", "type", "veth", "peer", "name", "extra1"],
                ["addr", "add", "10.99.0.1/24", "dev", "extra0"], ["link", "set", "extra0", "up"]):  # fmt: skip
        assert nodes.run(0, ["ip", *cmd]).returncode == 0
    got = _probe(nodes, 0, calls)
    assert got["own_addr"] == [n0.addr, "eth0"]  # an address still routes
    assert got["own_name"].startswith("NetifError: 'node0' resolves to a loopback address (127.0.1.1)")
    assert "eth0 (" in got["own_name"] and "extra0 (10.99.0.1)" in got["own_name"]
