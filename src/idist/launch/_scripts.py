"""``idist run``: start a script once per local rank, prefix its output, fail fast, leave nothing.

Each rank is ``python -u script args`` (or ``-m module``) with torchrun's variables (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, NNODES, MASTER_ADDR, MASTER_PORT), in
its own process group, and dies with the launcher (``PR_SET_PDEATHSIG``), even a SIGKILLed
one. Every output line gets one ``[rankN]:`` prefix. The first rank that fails stops the
others; the launcher then exits with that rank's status (128 + N for signal N). Rank 0 serves
the rendezvous store, on loopback for one node (the port is reserved here until the end).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import IO

from .. import _marks
from ._child import die_with_parent
from ._handle import signal_name
from ._plan import LaunchPlan
from ._ports import LOOPBACK, PortReservation, reserve_port
from ._procs import INHERITED_RANK_VARS

#: seconds the other ranks get after SIGTERM before SIGKILL
GRACE_SECONDS = 3.0
#: what a rank that gloo aborted most likely did (see docs/failures.md, "Checked mode")
ABORT_HINT = (
    "gloo aborts a rank whose peer sends more bytes than its tensor holds, as in an all_reduce of float32 "
    "on one rank and float64 on another: run with --checked to compare every call first"
)


def _own_group_dying_with_parent() -> None:
    """In the rank, before exec: its own process group, and SIGKILL when the launcher dies."""
    os.setpgrp()
    die_with_parent()


def _pump(stream: IO[bytes], prefix: bytes, out: IO[bytes], lock: threading.Lock) -> None:
    for line in iter(stream.readline, b""):
        if not line.endswith(b"\n"):
            line += b"\n"
        if not line.startswith(prefix):  # torch's excepthook prefixes tracebacks with the rank itself
            line = prefix + line
        with lock:
            out.write(line)
            out.flush()
    stream.close()


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every rank still running (its whole process group), SIGKILL after a grace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, sig)
        deadline = time.monotonic() + GRACE_SECONDS
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)


def run_script(plan: LaunchPlan, target: Sequence[str], extra_env: Mapping[str, str], node_label: str = "") -> int:
    """Run ``python -u *target`` once per local rank of ``plan``; the launcher's exit status."""
    reservation: PortReservation | None = None
    addr = plan.master_addr or LOOPBACK
    port = plan.master_port
    if port is None:
        reservation = reserve_port(addr)
        port = reservation.port
    base = {k: v for k, v in os.environ.items() if k not in INHERITED_RANK_VARS}
    base.update(extra_env)
    marks = _marks.board(plan.nproc_per_node)  # each rank's last collective (``_marks``)
    procs: list[subprocess.Popen[bytes]] = []
    pumps: list[threading.Thread] = []
    lock = threading.Lock()
    stopped_by: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopped_by.append(signum)
        _stop(procs)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for local in range(plan.nproc_per_node):
            t = plan.topology(local)
            env = dict(
                base,
                RANK=str(t.rank),
                LOCAL_RANK=str(local),
                WORLD_SIZE=str(t.world_size),
                LOCAL_WORLD_SIZE=str(t.nproc_per_node),
                GROUP_RANK=str(t.node_rank),
                NNODES=str(t.nnodes),
                MASTER_ADDR=addr,
                MASTER_PORT=str(port),
            )
            if marks is not None:
                env[_marks.MARKS_VAR] = marks.variable(local)
            p = subprocess.Popen(
                [sys.executable, "-u", *target],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=_own_group_dying_with_parent,
                pass_fds=() if marks is None else (marks.fd,),
            )
            procs.append(p)
            prefix = f"[rank{t.rank}]:".encode()
            for stream, out in ((p.stdout, sys.stdout.buffer), (p.stderr, sys.stderr.buffer)):
                assert stream is not None
                pump = threading.Thread(target=_pump, args=(stream, prefix, out, lock), daemon=True)
                pump.start()
                pumps.append(pump)
        return _watch(plan, procs, stopped_by, node_label, marks)
    finally:
        _stop(procs)
        if marks is not None:
            marks.close()
        for pump in pumps:
            pump.join(5.0)
        for s, handler in old.items():
            signal.signal(s, handler)
        if reservation is not None:
            reservation.close()


def _watch(
    plan: LaunchPlan, procs: list[subprocess.Popen[bytes]], stopped_by: list[int], node: str, marks: _marks.Board | None
) -> int:
    """Wait for every rank; on the first failure stop the others and say which rank failed (and, for
    a rank killed by a signal, the collective it was in, from its stall mark)."""
    while True:
        if stopped_by:
            received = signal.Signals(stopped_by[0])
            print(f"idist run: stopped every rank on {received.name}", file=sys.stderr)
            return 128 + received.value
        codes = [p.poll() for p in procs]
        failed = [(local, c) for local, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            local, code = failed[0]
            assert code is not None
            sig = signal_name(code)
            rank = plan.topology(local).rank
            how = f"was killed by {sig}" if sig else f"exited with code {code}"
            last = marks.read(local) if sig and marks is not None else None
            if last is not None:
                how += f" in {last} (its last collective)"
                how += f"; {ABORT_HINT}" if code == -signal.SIGABRT else ""
            print(f"idist run: rank {rank} (local rank {local}{node}) {how}; stopped the others", file=sys.stderr)
            _stop(procs)
            return 128 - code if code < 0 else code
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.05)
