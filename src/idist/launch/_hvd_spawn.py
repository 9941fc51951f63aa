"""``spawn``/``Parallel`` with ``backend="horovod"``: the launcher process runs ``horovod.run``.

``horovod.run(fn, num_proc=N, hosts="localhost:N", use_gloo=True)`` starts N ranks with
Horovod's gloo launcher and ships ``fn`` with cloudpickle; each rank initializes the
process default context, calls ``fn(local_rank, ...)`` and finalizes. Horovod's own error
names the first process to *exit* (often a peer of the failed rank); the reports name the
rank that failed first in time, and a rank that died without one is named from Horovod's
message with its exit status.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import sys

import attrs

from .._backends.horovod import _lib
from .._errors import LaunchError, PeerLostError
from ._driven import Job, call_rank
from ._reports import Reporter, ReportFolder, earliest, rank_failure

#: seconds horovod.run may take to start its workers (HOROVOD_START_TIMEOUT overrides)
START_TIMEOUT = 120


@attrs.frozen
class _HorovodRank:
    """What ``horovod.run`` calls in each rank process (cloudpickled to it)."""

    job: Job
    reporter: Reporter

    def __call__(self) -> None:
        rank = int(os.environ.get("HOROVOD_RANK", "0"))
        local_rank = int(os.environ.get("HOROVOD_LOCAL_RANK", "0"))
        call_rank(self.job, rank, local_rank, self.reporter, scoped=False)


def drive(job: Job) -> list[object]:
    """In the launcher process: ``horovod.run`` on this host, then results or the first failure."""
    _lib.load()  # BackendUnavailableError with the hint when horovod.torch cannot load
    import horovod  # the launcher process imports horovod itself: it runs horovod.run

    _reachable_from_ranks(job)
    n = job.nproc
    with ReportFolder(job.reports) as folder:
        try:
            horovod.run(
                _HorovodRank(job, folder.reporter),
                num_proc=n,
                hosts=f"localhost:{n}",
                use_gloo=True,
                disable_cache=True,  # no check cache written under ~/.horovod
                start_timeout=int(os.environ.get("HOROVOD_START_TIMEOUT", START_TIMEOUT)),
            )
        except Exception as exc:
            raise _blame(folder, exc, n) from exc
        return folder.results(n, "horovod.run")


def _blame(folder: ReportFolder, exc: Exception, world_size: int) -> LaunchError:
    """The rank to blame: the first that failed by itself, else one that died silently.

    A ``PeerLostError`` is a consequence (Horovod shut down under a rank waiting for a peer
    that raised or died); a rank with no report at all died without running its except
    clause (a signal, ``os._exit``).
    """
    errors = folder.errors()
    own = earliest(e for e in errors.values() if e.kind != PeerLostError.__name__)
    if own is not None:
        return rank_failure(own, world_size)
    done = folder.read("ok")
    silent = [r for r in range(world_size) if r not in errors and r not in done]
    first = earliest(errors.values())
    if silent or first is None:
        return _unreported(exc, world_size, silent)
    return rank_failure(first, world_size)


def _reachable_from_ranks(job: Job) -> None:
    """Let the rank processes load ``fn`` as this process can (this process is ours to change).

    Horovod's ranks are fresh interpreters (``python -m horovod.runner.run_task``) that get
    ``fn`` through cloudpickle, by reference to its module. Two things differ from this
    process: their ``__main__`` is Horovod's task runner, not the user's script, so a
    function from the script must travel by value; and their ``sys.path`` comes from
    PYTHONPATH alone, so the script's folder (which ``multiprocessing`` put on this
    process's path) is passed on through PYTHONPATH.
    """
    cloudpickle = importlib.import_module("cloudpickle")  # horovod's dependency, untyped
    for obj in (job.fn, *job.args, *job.kwargs.values()):
        name = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", None)
        if name in ("__main__", "__mp_main__") and name in sys.modules:
            cloudpickle.register_pickle_by_value(sys.modules[name])
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*paths, *(old.split(os.pathsep) if old else [])]))


def _unreported(exc: Exception, world_size: int, silent: list[int]) -> LaunchError:
    """A failure no rank reported: Horovod's message names the first process to exit."""
    text = str(exc)
    m = re.search(r"Process name: (\d+)\s+Exit code: (-?\d+)", text)
    if m is None or (silent and int(m.group(1)) not in silent):
        if not silent:
            return LaunchError(f"horovod.run failed: {type(exc).__name__}: {text.strip()}")
        rank = silent[0]
        others = ", ".join(str(r) for r in range(world_size) if r != rank)
        text = (
            f"rank {rank} (local rank {rank}) died before fn returned, without an exception (killed, or "
            "os._exit?); Horovod's log above has its output"
        )
        if others:
            text += f"\n\nthe other ranks ({others}) were stopped"
        return LaunchError(text, rank=rank, local_rank=rank)
    rank, code = int(m.group(1)), int(m.group(2))
    sig: str | None = None
    if code > 128:
        try:
            sig = signal.Signals(code - 128).name
        except ValueError:
            sig = None
    what = f"was killed by {sig} (exit status {code})" if sig else f"exited with code {code}"
    others = ", ".join(str(r) for r in range(world_size) if r != rank)
    return LaunchError(
        f"rank {rank} (local rank {rank}) {what} before fn returned (Horovod's report; its output above has "
        "the details)" + (f"\n\nthe other ranks ({others}) were stopped" if others else ""),
        rank=rank,
        local_rank=rank,
        exitcode=code,
        signal_name=sig,
    )
