"""``spawn``/``Parallel`` for backends whose own launcher starts the ranks: Horovod, XLA.

    parent ──_procs──▶ launcher process ──horovod.run──────▶ N Horovod rank processes
                                        └─torch_xla.launch─▶ one XLA process, a thread per replica

The launcher process is started and watched like a rank and runs the backend's launcher,
so whatever that changes in its process ends with it. Each rank reports its result or
failure (``_reports``); the launcher process returns the results in rank order or the
``LaunchError`` of the rank that failed first. See docs/design.md, "Launching".
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import time
from collections.abc import Callable, Mapping

import attrs

from .. import _stack
from .._backends import context_class
from .._context import DistContext
from .._errors import BackendUnavailableError, LaunchConfigError, LaunchError
from ._plan import LaunchPlan, check_start_method
from ._procs import start
from ._reports import Reporter, ReportFolder

#: backend -> (package that must be importable, module of its driver)
DRIVEN = {"horovod": ("horovod", "._hvd_spawn"), "xla-tpu": ("torch_xla", "._xla_spawn")}


@attrs.frozen(kw_only=True)
class Job:
    """One ``spawn`` of a driven backend, as the launcher process receives it."""

    backend: str
    fn: Callable[..., object]
    args: tuple[object, ...]
    kwargs: Mapping[str, object]
    init_kwargs: Mapping[str, object]
    nproc: int
    start_method: str
    #: the parent's report folder (``_reports``), set by ``run``
    reports: str = ""


def installed(package: str) -> bool:
    """Whether ``package`` is installed, found without importing it (a folder of the same
    name on ``sys.path``, such as a test directory, is a namespace package: not it)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None


def check_options(
    backend: str, plan: LaunchPlan, *, join: bool, daemon: bool, init_method: str | None, start_method: str
) -> None:
    """``LaunchConfigError`` for what the backend's own launcher cannot do."""
    who = {"horovod": "horovod.run", "xla-tpu": "torch_xla.launch"}[backend]
    check_start_method(start_method)
    if not join:
        raise LaunchConfigError(
            f"spawn(backend={backend!r}) always joins ({who} returns when every rank is done); drop join=False"
        )
    if daemon:
        raise LaunchConfigError(
            f"spawn(backend={backend!r}) cannot use daemon=True: {who} starts processes of its own, "
            "which daemonic processes may not; drop daemon="
        )
    if plan.nnodes != 1 or plan.node_rank != 0:
        hint = (
            "start a multi-host Horovod job with horovodrun -H host1:N,host2:N (idist.initialize() inside)"
            if backend == "horovod"
            else "on a TPU pod, run the script on every host (torch_xla finds the pod's plan itself)"
        )
        raise LaunchConfigError(f"spawn(backend={backend!r}) runs on one node: {hint}")
    if plan.master_addr is not None or plan.master_port is not None or init_method is not None:
        raise LaunchConfigError(
            f"{who} chooses its own rendezvous: drop master_addr=, master_port= and init_method= "
            f"for backend={backend!r}"
        )


def run(job: Job) -> list[object]:
    """Run ``job`` through its backend's launcher in a launcher process; the results in rank order.

    Raises ``BackendUnavailableError`` when the backend's package is missing (checked
    here, without importing it), ``LaunchError`` naming the rank that failed first.
    """
    package, _ = DRIVEN[job.backend]
    if not installed(package):
        raise BackendUnavailableError(context_class(job.backend).unavailable_reason(job.backend))
    with ReportFolder() as folder:
        return _run_in(attrs.evolve(job, reports=folder.path))


def _run_in(job: Job) -> list[object]:
    # The launcher process and everything it starts keep their temporary files in the report
    # folder, which the parent removes: a process stopped by a signal runs no clean-up, and
    # torch alone leaves a folder per process (torch.distributed.nn's remote-module template).
    tmp = os.path.join(job.reports, "tmp")
    os.mkdir(tmp, 0o700)
    try:
        handle = start(
            drive,
            (job,),
            {},
            LaunchPlan(nproc_per_node=1),
            start_method=job.start_method,
            rank_env=False,
            extra_env={"TMPDIR": tmp},
            join=True,
        )
    except LaunchError as exc:
        # The launcher process itself died (not a rank: their failures come back as values).
        first = re.sub(r"^rank 0 \(local rank 0\) failed: ", "", str(exc).split("\n", 1)[0])
        raise LaunchError(
            f"the {job.backend} launcher process failed: {first}",
            exitcode=exc.exitcode,
            signal_name=exc.signal_name,
            traceback=exc.traceback,
        ) from exc
    outcome = handle.results[0]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def drive(local_rank: int, job: Job) -> list[object] | LaunchError | BackendUnavailableError:
    """The launcher process: the backend's launcher, then the results or the first failure."""
    _, module = DRIVEN[job.backend]
    try:
        driver: Callable[[Job], list[object]] = importlib.import_module(module, __package__).drive
        return driver(job)
    except (LaunchError, BackendUnavailableError) as exc:
        return exc  # a value, so that the parent raises it as it is


def call_rank(
    job: Job,
    rank: int,
    local_rank: int,
    reporter: Reporter,
    *,
    scoped: bool,
    check: Callable[[DistContext], None] | None = None,
) -> None:
    """One rank: initialize ``job.backend``, ``fn(local_rank, ...)``, finalize, report.

    ``scoped``: the context is current in this thread only (XLA device threads share one
    process), else it is the process default, as ``idist.initialize()`` makes it. A failure
    is reported before the context closes (the time in the report is when it happened),
    then re-raised.
    """
    ctx: DistContext | None = None
    try:
        make = _stack.create if scoped else _stack.initialize
        ctx = make(job.backend, **job.init_kwargs)
        rank, local_rank = ctx.rank, ctx.local_rank
        if check is not None:
            check(ctx)
        with _stack.use(ctx):
            try:
                result = job.fn(ctx.local_rank, *job.args, **job.kwargs)
            except SystemExit as exc:
                if exc.code not in (None, 0):
                    raise
                result = None
    except BaseException as exc:
        code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
        reporter.error(rank, local_rank, exc, time.time(), code)
        if ctx is not None:
            with contextlib.suppress(Exception):
                _close(ctx, scoped)  # after the report: peers blocked on this rank fail from here on
        raise
    # Reported while the context is open: a result that cannot be sent is this rank's
    # failure, and it must come before the peers notice this rank leave.
    try:
        sent = reporter.result(rank, local_rank, result)
    finally:
        _close(ctx, scoped)
    if not sent:
        raise LaunchError(f"rank {rank}: fn's return value cannot be sent to the parent")


def _close(ctx: DistContext, scoped: bool) -> None:
    if scoped:
        ctx.close()
    else:
        _stack.finalize()
