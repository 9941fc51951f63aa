"""Nodes as Linux network namespaces: real, separately addressed machines on one host.

``NodeNet(n, workdir)`` builds, on entry::

    <run>-sw   a "switch" namespace holding bridge br0 and one port p<i> per node
    <run>-n<i> node i: lo + eth0 (the veth peer of p<i>) with 10.213.X.(10+i)/24

The host's own network is never touched: the bridge, the veth pairs and the subnet exist
only inside namespaces this run created, so nothing can reach any address outside them
(there is no default route in a node; DNS is pointed at the node's own loopback).
``<run>`` is ``idn<pid>x<hex>``: unique per run, and a later run deletes the namespaces
of runs whose pid is gone (a crash, a test-timeout ``os._exit``, SIGKILL).

Every command runs as ``ip netns exec <node> unshare --uts`` with the node's hostname
set and the node's own ``/etc/hosts`` and ``/etc/resolv.conf`` bind-mounted (in the
private mount namespace ``ip netns exec`` makes, so the host's files are never changed).
By default each node's hosts file maps every node's hostname to its eth0 address (a
well-configured cluster); ``set_hosts`` rewrites it, e.g. ``127.0.1.1 node1`` (Debian's
default for a machine's own name).

Faults: ``link(i, False)`` takes the switch port of node i down (a pulled cable: the
node's packets vanish, nothing is reset), ``kill_node(i)`` SIGKILLs every process whose
network namespace is node i's (``ip netns pids``: the launcher, its ranks, anything
they started), ``pids(i)`` lists what still runs there. Exit (also on an exception or
Ctrl-C) kills every process on every node and deletes every namespace.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

PREFIX = "idn"
_NAME = re.compile(rf"^{PREFIX}(\d+)x[0-9a-f]+-")
#: the wrapper each node command runs under (after ``ip netns exec NS unshare --uts --``)
_WRAP = 'hostname "$1" && mount --bind "$2" /etc/hosts && mount --bind "$3" /etc/resolv.conf && shift 3 && exec "$@"'
LAUNCH_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NNODES", "MASTER_ADDR", "MASTER_PORT",
    "GLOO_SOCKET_IFNAME", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID",
)  # fmt: skip


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (tests skip with it), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs the netns tests as root)"
    for tool in ("ip", "unshare", "mount", "ss"):
        if shutil.which(tool) is None:
            return f"{tool!r} is not on PATH (iproute2/util-linux needed for the netns tests)"
    probe = f"{PREFIX}{os.getpid()}x{secrets.token_hex(3)}-probe"
    try:
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"cannot create a network namespace: {made.stderr.strip()}"
        veth = _ip("-n", probe, "link", "add", "name", "a", "type", "veth", "peer", "name", "b", check=False)
        if veth.returncode != 0:
            return f"cannot create a veth pair: {veth.stderr.strip()}"
        return None
    finally:
        _ip("netns", "del", probe, check=False)


@functools.cache
def skip_reason() -> str | None:
    """``unavailable_reason()``, probed once per process."""
    return unavailable_reason()


def netns_pids(ns: str) -> list[int]:
    r = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in r.stdout.split()] if r.returncode == 0 else []


def _kill_all(ns: str, sig: int = signal.SIGKILL, timeout: float = 10.0) -> list[int]:
    """Send ``sig`` to every process in ``ns`` until none is left; return those left at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        pids = netns_pids(ns)
        if not pids or time.monotonic() > deadline:
            return pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(0.05)


def _delete(ns: str) -> None:
    _kill_all(ns)
    _ip("netns", "del", ns, check=False)


def sweep_stale() -> list[str]:
    """Delete the namespaces of earlier runs whose process is gone; return their names."""
    r = _ip("netns", "list", check=False)
    gone = []
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NAME.match(name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            _delete(name)
            gone.append(name)
    return gone


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.213.X.0/24 that no host address or route overlaps (it only ever exists inside our namespaces)."""
    used: list[ipaddress.IPv4Network] = []
    for what in (("-4", "-j", "addr"), ("-4", "-j", "route")):
        try:
            data = json.loads(_ip(*what).stdout or "[]")
        except (subprocess.CalledProcessError, json.JSONDecodeError):
            continue
        for entry in data:
            for a in entry.get("addr_info", []):
                used.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
            dst = entry.get("dst")
            if dst and dst != "default":
                used.append(ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False))
    for _ in range(100):
        net = ipaddress.ip_network(f"10.213.{secrets.randbelow(254) + 1}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free 10.213.X.0/24 test subnet")


@dataclass
class Node:
    index: int
    ns: str
    addr: str
    hostname: str
    hosts_file: Path
    resolv_file: Path


@dataclass
class NodeProc:
    """One command running on a node; its stdout and stderr go to ``log``."""

    node: Node
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None

    def watch(self) -> None:
        """Record when the command exits (``ended``), whenever the test looks (a thread of ``start``)."""
        self.popen.wait()
        self.ended = time.monotonic()

    def wait(self, timeout: float) -> int | None:
        """The exit status (negative: killed by that signal), or None if still running at ``timeout``."""
        try:
            rc = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        while self.ended is None:  # the watcher records the exit right after it
            time.sleep(0.001)
        return rc

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    @property
    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class NodeNet:
    """``n`` nodes on one bridge; a context manager that always tears everything down."""

    def __init__(self, n: int, workdir: Path, *, subnet: str | None = None) -> None:
        self.run_id = f"{PREFIX}{os.getpid()}x{secrets.token_hex(3)}"
        self.workdir = workdir
        self.subnet = ipaddress.ip_network(subnet) if subnet else _free_subnet()
        self.switch = f"{self.run_id}-sw"
        hosts = list(self.subnet.hosts())
        self.nodes = [
            Node(i, f"{self.run_id}-n{i}", str(hosts[9 + i]), f"node{i}", workdir / f"hosts.n{i}", workdir / "resolv")
            for i in range(n)
        ]
        self.procs: list[NodeProc] = []
        self._made: list[str] = []

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> NodeNet:
        sweep_stale()
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _build(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "resolv").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        self._add_ns(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for node in self.nodes:
            self._add_ns(node.ns)
            _ip("-n", self.switch, "link", "add", f"p{node.index}", "type", "veth", "peer", "name", "eth0",
                "netns", node.ns)  # fmt: skip
            _ip("-n", self.switch, "link", "set", f"p{node.index}", "master", "br0", "up")
            _ip("-n", node.ns, "addr", "add", f"{node.addr}/{self.subnet.prefixlen}", "dev", "eth0")
            _ip("-n", node.ns, "link", "set", "eth0", "up")
            self.set_hosts(node.index)

    def close(self) -> None:
        """Kill every process on every node, reap ours, delete every namespace (idempotent)."""
        for ns in reversed(self._made):
            _kill_all(ns)
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                p.popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(5)
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made.clear()
        atexit.unregister(self.close)

    # -- configuration ---------------------------------------------------------------------
    def default_hosts(self) -> str:
        lines = ["127.0.0.1 localhost"] + [f"{n.addr} {n.hostname}" for n in self.nodes]
        return "\n".join(lines) + "\n"

    def set_hosts(self, i: int, text: str | None = None) -> None:
        """Node i's /etc/hosts (rewritten in place: running commands see it too)."""
        with open(self.nodes[i].hosts_file, "w") as f:
            f.write(self.default_hosts() if text is None else text)

    def _resolving_to(self, i: int, addr: str) -> str:
        node = self.nodes[i]
        others = [f"{n.addr} {n.hostname}" for n in self.nodes if n is not node]
        return "\n".join(["127.0.0.1 localhost", f"{addr} {node.hostname}", *others]) + "\n"

    def hostname_resolves_to(self, i: int, addr: str) -> None:
        """Node i's own hostname resolves to ``addr`` there (e.g. 127.0.1.1); the others' stay right."""
        self.set_hosts(i, self._resolving_to(i, addr))

    def hosts_resolving_to(self, i: int, addr: str) -> Path:
        """A second hosts file for node i, as ``hostname_resolves_to`` writes it, for the commands
        started with it (``start(..., hosts=)``) while the node's others keep the right one."""
        path = self.workdir / f"hosts.n{i}.{addr}"
        path.write_text(self._resolving_to(i, addr))
        return path

    # -- processes -------------------------------------------------------------------------
    def argv(self, i: int, cmd: Sequence[str], hosts: Path | None = None) -> list[str]:
        node = self.nodes[i]
        return [
            "ip", "netns", "exec", node.ns, "unshare", "--uts", "--", "sh", "-c", _WRAP, "sh",
            node.hostname, str(hosts or node.hosts_file), str(node.resolv_file), *cmd,
        ]  # fmt: skip

    def start(
        self, i: int, cmd: Sequence[str], env: Mapping[str, str] | None = None, name: str = "",
        hosts: Path | None = None,
    ) -> NodeProc:  # fmt: skip
        """Start ``cmd`` on node i in its own session (``hosts``: its /etc/hosts instead of the
        node's); output to ``workdir/<name>.log``."""
        node = self.nodes[i]
        name = name or f"n{i}-{len(self.procs)}"
        log = self.workdir / f"{name}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                self.argv(i, cmd, hosts), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else clean_env(), start_new_session=True,
            )  # fmt: skip
        proc = NodeProc(node, name, popen, log)
        threading.Thread(target=proc.watch, daemon=True).start()
        self.procs.append(proc)
        return proc

    def run(self, i: int, cmd: Sequence[str], timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        """Run a short command on node i and return its output."""
        return subprocess.run(self.argv(i, cmd), capture_output=True, text=True, timeout=timeout, env=clean_env())

    def listeners(self, i: int) -> list[tuple[str, str]]:
        """(local address:port, process) for every listening TCP socket on node i."""
        out = _ip("netns", "exec", self.nodes[i].ns, "ss", "-Htlnp").stdout
        rows = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 4:
                rows.append((parts[3], " ".join(parts[5:])))
        return rows

    # -- faults ----------------------------------------------------------------------------
    def link(self, i: int, up: bool) -> None:
        """Node i's switch port up or down (down: its packets are dropped, nothing is reset)."""
        _ip("-n", self.switch, "link", "set", f"p{i}", "up" if up else "down")

    def pids(self, i: int) -> list[int]:
        return netns_pids(self.nodes[i].ns)

    def describe(self, pids: Sequence[int]) -> list[str]:
        out = []
        for pid in pids:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                cmd = "?"
            out.append(f"{pid}: {cmd[:160]}")
        return out

    def kill_node(self, i: int, sig: int = signal.SIGKILL) -> list[int]:
        """Send ``sig`` to every process on node i (repeatedly, until none is left); return the pids hit."""
        hit = netns_pids(self.nodes[i].ns)
        left = _kill_all(self.nodes[i].ns, sig, timeout=10.0 if sig == signal.SIGKILL else 0.0)
        assert sig != signal.SIGKILL or not left, f"node {i}: still running after SIGKILL: {left}"
        return hit

    def wait_empty(self, i: int, timeout: float) -> list[int]:
        """Wait until no process runs on node i; return the pids left at the deadline."""
        deadline = time.monotonic() + timeout
        while (pids := self.pids(i)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return pids


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher variable, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCH_VARS and not k.startswith(("SLURM_", "OMPI_", "PMI", "TORCHELASTIC_", "PYTEST_"))
    }
    env.update(extra)
    return env


# -- jobs: netns_job.py on every node through one of the four launchers -------------------------
JOB = Path(__file__).resolve().parent / "netns_job.py"
LAUNCHERS = ("spawn", "parallel", "idist-run", "torchrun")


def job_cmd(launcher: str, node_rank: int, master: str, port: int, out: Path, job_args: Sequence[str]) -> list[str]:
    """The command that starts node ``node_rank``'s share (2 ranks) of a 2-node job."""
    py = sys.executable
    tail = [str(out), *job_args]
    if launcher == "idist-run":
        return [py, "-m", "idist", "run", "-n", "2", "--nnodes", "2", "--node-rank", str(node_rank),
                "--master-addr", master, "--master-port", str(port), str(JOB), "env", *tail]  # fmt: skip
    if launcher == "torchrun":
        return [py, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "0",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{master}:{port}", "--rdzv-id", f"job{port}",
                str(JOB), "env", *tail]  # fmt: skip
    return [py, str(JOB), launcher, *tail, "--node-rank", str(node_rank), "--master-addr", master,
            "--master-port", str(port)]  # fmt: skip


@dataclass
class Job:
    out: Path
    tag: str
    procs: list[NodeProc]

    def wait(self, timeout: float) -> list[int | None]:
        """Every launcher's exit status (None: still running at ``timeout`` seconds from now)."""
        deadline = time.monotonic() + timeout
        return [p.wait(max(0.0, deadline - time.monotonic())) for p in self.procs]

    def results(self) -> dict[int, dict[str, object]]:
        return {int(f.name[len(self.tag) + 4 : -5]): json.loads(f.read_text())
                for f in self.out.glob(f"{self.tag}rank*.json") if not f.name.endswith(".err.json")}  # fmt: skip

    def errors(self) -> dict[int, dict[str, object]]:
        return {int(f.name[len(self.tag) + 4 : -9]): json.loads(f.read_text())
                for f in self.out.glob(f"{self.tag}rank*.err.json")}  # fmt: skip

    def beats(self) -> dict[int, tuple[int, float]]:
        """rank -> (iterations done, wall time of the last one) for ``--work loop`` jobs."""
        found = {}
        for f in self.out.glob(f"{self.tag}beat*"):
            if f.suffix != ".tmp":
                n, t = f.read_text().split()
                found[int(f.name[len(self.tag) + 4 :])] = (int(n), float(t))
        return found

    def wait_beats(self, ranks: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.beats()) < ranks:
            if time.monotonic() > deadline or any(p.returncode is not None for p in self.procs):
                raise AssertionError(f"the job did not start looping within {timeout}s:\n{self.logs()}")
            time.sleep(0.1)

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(f"--- {p.name} (rc={p.returncode}):\n{p.output[-tail:]}" for p in self.procs)


def start_job(
    net: NodeNet,
    launcher: str,
    out: Path,
    port: int,
    job_args: Sequence[str] = (),
    *,
    nodes: Sequence[int] = (0, 1),
    tag: str = "",
    env: Mapping[int, Mapping[str, str]] | None = None,
    hosts: Mapping[int, Path] | None = None,
) -> Job:
    """Start a 2-node x 2-rank job of ``netns_job.py`` on ``nodes`` (node ranks 0 and 1 on the first
    and the second of ``nodes``, rendezvous at the first, ``port``; a job on nodes 2 and 3 runs
    beside one on 0 and 1 and a fault on one pair leaves the other alone; ``hosts``: node -> the
    /etc/hosts this job sees there, if not the node's)."""
    out.mkdir(parents=True, exist_ok=True)
    args = [*job_args, "--tag", tag] if tag else list(job_args)
    procs = []
    master = net.nodes[min(nodes)].addr
    for i in nodes:
        e = clean_env(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env or {}).get(i, {}))
        cmd = job_cmd(launcher, i - min(nodes), master, port, out, args)
        procs.append(net.start(i, cmd, e, name=f"{tag or 'job'}-{launcher}-n{i}", hosts=(hosts or {}).get(i)))
    return Job(out, tag, procs)
