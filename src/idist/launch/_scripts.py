"""``idist run``: start a script once per local rank, pass its output on, fail fast, leave nothing.

Each rank is ``python -u script args`` (or ``-m module``) with torchrun's variables, leads a
session of its own (``_sessions``) and gets SIGKILL when the launcher dies (``PR_SET_PDEATHSIG``);
the launcher adopts the orphans of the ranks' children (a subreaper), and at the end, however the
job ends, ends every process left in the ranks' sessions. Rank 0 (or ``--pdb-rank``) reads the
launcher's stdin, the others ``/dev/null``. Output: ``_output``. The first rank that fails stops
the others; the exit status is that rank's (128 + N for signal N), 128 + N for a signal N to the
launcher, 141 when the reader of the output went away (``| head``).
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import FrameType

from .. import _marks
from .._rank_vars import INHERITED_RANK_VARS
from . import _deathsig, _sessions
from ._handle import signal_name
from ._output import Output
from ._plan import LaunchPlan
from ._ports import LOOPBACK, PortReservation, reserve_port

#: seconds the ranks (and what they started) get after SIGTERM before SIGKILL
GRACE_SECONDS = 3.0
#: the status of a launcher whose output's reader went away, as for a process SIGPIPE killed
BROKEN_PIPE_STATUS = 128 + signal.SIGPIPE
#: what a rank that gloo aborted most likely did (see docs/failures.md, "Checked mode")
ABORT_HINT = (
    "gloo aborts a rank whose peer sends more bytes than its tensor holds, as in an all_reduce of float32 "
    "on one rank and float64 on another: run with --checked to compare every call first"
)
PDB_BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_pdb_rank.py")
_PIPE_SIZE = 1 << 20


def standard_fds() -> None:
    """Open /dev/null on whichever of descriptors 0-2 is closed (``idist run >&-``), so that
    nothing the launcher opens lands there and the ranks' output has somewhere to go."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


class _Job:
    """The ranks of one ``idist run`` and what is known about them."""

    def __init__(self, plan: LaunchPlan, node: str, marks: _marks.Board | None) -> None:
        self.plan = plan
        self.node = node
        self.marks = marks
        self.procs: list[subprocess.Popen[bytes]] = []
        self.output = Output()
        self.signals: list[int] = []
        self.stopping = False
        #: a signal while the job is being stopped: SIGKILL now, and stop waiting for the reader
        self.hurry = threading.Event()
        #: children of the launcher that are not ranks (the sweeper): never reaped here
        self.keep: list[int] = []
        #: the local index of the rank under --pdb-rank, when it runs here
        self.spare: int | None = None

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)
        if self.stopping:
            self.hurry.set()

    @property
    def sessions(self) -> list[int]:
        return [p.pid for p in self.procs]

    def exitcode(self, local: int) -> int | None:
        """The rank's exit code (-N for signal N), or None while it runs; it stays unreaped (its
        pid is its session's id, which must not be reused before the session is ended)."""
        try:
            info = os.waitid(os.P_PID, self.procs[local].pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self.procs[local].returncode
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def watch(self) -> tuple[int, str | None]:
        """Wait until every rank exited, one failed, a signal came or the reader left: the
        launcher's status, and what to say about it. After a failure the others get
        ``SETTLE_SECONDS`` to end by themselves (with their own report) before they are stopped;
        the first failure sets the status. A rank being debugged (``spare``) is left to
        its debugger when another fails: the others are stopped, and the launcher waits for it."""
        last_reap = time.monotonic()
        first: tuple[int, str] | None = None
        settle_until = 0.0
        while True:
            if self.signals:
                received = signal.Signals(self.signals[0])
                return 128 + received.value, f"idist run: stopped every rank on {received.name}"
            if self.output.broken.is_set():
                return BROKEN_PIPE_STATUS, None
            codes = [self.exitcode(local) for local in range(len(self.procs))]
            if first is not None:
                if self.spare is not None and codes[self.spare] is None:
                    time.sleep(0.05)
                    continue
                if None in codes and time.monotonic() < settle_until:
                    time.sleep(0.05)
                    continue
                return first
            failed = [(local, c) for local, c in enumerate(codes) if c is not None and c != 0]
            if failed:
                # seen in the same look: a rank a signal killed is the likelier cause of the others'
                # exits (they lost it) than the other way round
                first = self.failure(*min(failed, key=lambda lc: (lc[1] > 0, lc[0])))
                settle_until = time.monotonic() + _sessions.SETTLE_SECONDS
                if self.spare is not None and codes[self.spare] is None:
                    self.output.say(first[1].replace("stopped the others", "stopping the others but the debugged rank"))
                    _sessions.end([p.pid for i, p in enumerate(self.procs) if i != self.spare], GRACE_SECONDS)
                continue
            if all(c == 0 for c in codes):
                return 0, None
            if time.monotonic() - last_reap > 1.0:
                _sessions.reap_orphans([*self.sessions, *self.keep])
                last_reap = time.monotonic()
            time.sleep(0.05)

    def failure(self, local: int, code: int) -> tuple[int, str]:
        """The status and the report for a rank that failed (a rank killed by a signal inside a
        collective is named with that collective, from its stall mark)."""
        sig = signal_name(code)
        rank = self.plan.topology(local).rank
        how = f"was killed by {sig}" if sig else f"exited with code {code}"
        last = self.marks.read(local) if sig and self.marks is not None else None
        if last is not None:
            how += f" in {last} (its last collective)"
            how += f"; {ABORT_HINT}" if code == -signal.SIGABRT else ""
        text = f"idist run: rank {rank} (local rank {local}{self.node}) {how}; stopped the others"
        return (128 - code if code < 0 else code), text

    def end(self) -> None:
        """End every process of the ranks' sessions (the ranks still running included), then reap."""
        self.stopping = True
        if self.signals[1:]:
            self.hurry.set()
        _sessions.end(self.sessions, GRACE_SECONDS, self.hurry)
        for p in self.procs:
            p.wait()
        _sessions.reap_orphans(self.keep)


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    try:  # a larger pipe: fewer wake-ups for a rank that prints a lot
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    except (OSError, AttributeError):
        pass
    return r, w


@contextmanager
def handled_signals(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """``handler`` for SIGINT, SIGTERM and SIGHUP in the block, except a signal ignored on entry (a
    background job of a shell ignores SIGINT; so does its launcher, as every program does)."""
    old: dict[signal.Signals, signal._HANDLER] = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) != signal.SIG_IGN:
            old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, before in old.items():
            signal.signal(sig, before)


def run_script(
    plan: LaunchPlan,
    target: Sequence[str],
    extra_env: Mapping[str, str],
    node_label: str = "",
    *,
    stdin_rank: int = 0,
    pdb: bool = False,
) -> int:
    """Run ``python -u *target`` once per local rank of ``plan``; the launcher's exit status.

    The rank ``stdin_rank`` (a global rank) reads this process's stdin, the others /dev/null and
    skip ``breakpoint()`` (unless ``PYTHONBREAKPOINT`` says otherwise); ``pdb``: that rank runs
    under ``_pdb_rank`` (post-mortem debugging on an uncaught exception).
    """
    standard_fds()
    reservation: PortReservation | None = None
    addr = plan.master_addr or LOOPBACK
    port = plan.master_port
    if port is None:
        reservation = reserve_port(addr)
        port = reservation.port
    base = {k: v for k, v in os.environ.items() if k not in INHERITED_RANK_VARS}
    base.update(extra_env, IDIST_LAUNCHER="idist run")
    job = _Job(plan, node_label, _marks.board(plan.nproc_per_node))
    marks = job.marks
    status, said = 1, None
    with _sessions.subreaper(), handled_signals(job.on_signal):
        sweeper = _sessions.Sweeper()
        job.keep += [] if sweeper.pid is None else [sweeper.pid]
        pipes: list[tuple[bytes, int, int, bool]] = []
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
                reads = t.rank == stdin_rank
                if reads and pdb:
                    job.spare = local
                if not reads:
                    env.setdefault("PYTHONBREAKPOINT", "0")  # no terminal to debug with
                if marks is not None:
                    env[_marks.MARKS_VAR] = marks.variable(local)
                (out_r, out_w), (err_r, err_w) = _pipe(), _pipe()
                pipes.append((f"[rank{t.rank}]:".encode(), out_r, err_r, reads and os.isatty(0)))
                boot = [PDB_BOOT] if pdb and reads else []
                try:
                    proc = subprocess.Popen(
                        [sys.executable, "-u", *boot, *target],
                        env=env,
                        stdin=None if reads else subprocess.DEVNULL,
                        stdout=out_w,
                        stderr=err_w,
                        start_new_session=True,  # its own session: see _sessions
                        preexec_fn=_deathsig.death_signal(signal.SIGKILL),
                        pass_fds=() if marks is None else (marks.fd,),
                    )
                finally:
                    os.close(out_w)
                    os.close(err_w)
                job.procs.append(proc)
                sweeper.watch(proc.pid)
            for prefix, out_r, err_r, echoed in pipes:  # once every rank is forked: no fork beside a thread
                job.output.add(prefix, out_r, err_r, echoed)
            pipes.clear()
            status, said = job.watch()
        finally:
            for _, out_r, err_r, _ in pipes:  # a rank failed to start: no pump took these
                os.close(out_r)
                os.close(err_r)
            job.end()
            job.output.drain(job.hurry)
            if status == 0 and job.signals:  # a signal cut the output short
                status = 128 + job.signals[0]
            if said is not None:
                job.output.say(said)
            sweeper.close()
            if marks is not None:
                marks.close()
            if reservation is not None:
                reservation.close()
    return status
