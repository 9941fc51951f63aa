"""What runs inside each spawned rank, before and around the user's function.

The child leads a session of its own (so the parent can stop it together with anything it
started, and a terminal's Ctrl-C reaches only the parent, which then stops every rank),
watches its parent (a parent that dies, even by SIGKILL, takes the ranks
with it), sets the launcher variables, runs ``fn(local_rank, *args, **kwargs)`` and
sends one message up its pipe: ``("ok", result)`` or ``("error", summary, traceback,
time, exit code)``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection

import attrs

from .. import _environ, _marks, _stack
from .._exit import flush_std, remove_torch_temp_files
from . import _deathsig, _sessions

#: How often a rank checks that its parent is still alive (a backstop to PR_SET_PDEATHSIG).
WATCHDOG_INTERVAL = 0.1


@attrs.frozen(kw_only=True)
class ChildSpec:
    fn: Callable[..., object]
    args: tuple[object, ...]
    kwargs: Mapping[str, object]
    local_rank: int
    rank: int
    #: the variables to set; None removes one (the parent's launcher's, contradicting this rank's own)
    env: Mapping[str, str | None]
    parent_pid: int
    #: ignite's form: initialize this backend around fn, finalize after
    backend: str | None = None
    init_kwargs: Mapping[str, object] = attrs.field(factory=dict)
    #: this rank's slot of the launcher's stall marks (``_marks``), if it has a board
    marks: _marks.Handed | None = None


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(WATCHDOG_INTERVAL)
        if os.getppid() != parent:
            # The launcher is gone: nobody would ever join us. Take our own session down
            # (whatever this rank started, then the rank) rather than run on as orphans.
            try:
                _sessions.signal_sessions({os.getsid(0)}, signal.SIGKILL)
            finally:
                os._exit(1)


def die_with_parent() -> None:
    """The kernel sends this process SIGKILL the moment its parent dies (Linux; elsewhere the
    watchdog below is all there is)."""
    _deathsig.death_signal(signal.SIGKILL, check=False)()


def _isolate(spec: ChildSpec) -> None:
    try:
        os.setsid()  # a session of its own: a terminal never stops it, and what it starts stays in it
    except OSError:
        os.setpgrp()
    if spec.parent_pid != -1:
        # not for forkserver children, whose parent is the server, nor when the launching thread
        # may end before the launch does (the signal follows the thread that started us)
        die_with_parent()
    parent = os.getppid()
    if parent != spec.parent_pid and spec.parent_pid != -1:
        os._exit(1)  # the launcher died before we started
    threading.Thread(target=_watch_parent, args=(parent,), name="idist-parent-watchdog", daemon=True).start()


def _summary(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__qualname__}: {text}" if text else type(exc).__qualname__


def _call(spec: ChildSpec, failed_at: list[float]) -> object:
    """``fn`` (inside an initialized context for ignite's form); ``failed_at`` gets the time
    fn raised, taken before finalizing breaks the peers (the first failure in time is blamed)."""
    if spec.backend is None:
        return spec.fn(spec.local_rank, *spec.args, **spec.kwargs)
    _stack.initialize(spec.backend, **spec.init_kwargs)
    try:
        return spec.fn(spec.local_rank, *spec.args, **spec.kwargs)
    except BaseException:
        failed_at.append(time.time())
        raise
    finally:
        _stack.finalize()


def child_main(spec: ChildSpec, conn: Connection) -> None:
    """The target of every spawned rank process."""
    _isolate(spec)
    _environ.apply(spec.env)
    _marks.received(spec.marks)
    code = 0
    failed_at: list[float] = []
    try:
        result = _call(spec, failed_at)
        message: tuple[object, ...] = ("ok", result)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code == 0:
            message = ("ok", None)
        else:
            message = ("error", f"sys.exit({e.code!r})", traceback.format_exc(), [*failed_at, time.time()][0], code)
    except BaseException as e:
        code = 1
        message = ("error", _summary(e), traceback.format_exc(), [*failed_at, time.time()][0], code)
    # a fork or forkserver child ends with os._exit when this returns, past torch's atexit
    remove_torch_temp_files()
    flush_std()
    try:
        conn.send(message)
    except Exception as e:  # the result did not pickle
        code = 1
        what = f"fn returned a {type(message[1]).__qualname__} that cannot be sent to the parent ({_summary(e)})"
        conn.send(("error", f"{what}; return None or a picklable value", traceback.format_exc(), time.time(), code))
    conn.close()
    if code:
        sys.exit(code)
