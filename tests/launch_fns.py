"""Functions that the launcher tests run inside spawned ranks (importable by name)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import idist

LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NNODES", "MASTER_ADDR")


def report(local_rank: int, tag: str = "") -> dict[str, Any]:
    """torch.multiprocessing's form of spawn: a plain initialize() inside fn joins the world the parent set up."""
    env = {k: os.environ.get(k) for k in LAUNCH_VARS}
    env["MASTER_PORT"] = os.environ.get("MASTER_PORT")
    ctx = idist.initialize()
    try:
        return {
            "tag": tag,
            "local_rank_arg": local_rank,
            "env": env,
            "pid": os.getpid(),
            "type": type(ctx).__name__,
            "backend": ctx.backend,
            "rank": ctx.rank,
            "world_size": ctx.world_size,
            "local_rank": ctx.local_rank,
            "node_rank": ctx.node_rank,
            "nnodes": ctx.nnodes,
            "nproc_per_node": ctx.nproc_per_node,
            "gathered": ctx.all_gather(ctx.rank),
            "sum": ctx.all_reduce(ctx.rank + 1),
            "ompi_seen": os.environ.get("OMPI_COMM_WORLD_RANK"),
        }
    finally:
        idist.finalize()


def ignite_style(local_rank: int, a: int, b: int = 0, *, c: int = 0) -> dict[str, Any]:
    """ignite's form: the context is initialized around fn; module functions see it."""
    return {
        "local_rank_arg": local_rank,
        "rank": idist.get_rank(),
        "world_size": idist.get_world_size(),
        "backend": idist.backend(),
        "model": idist.model_name(),
        "value": idist.all_reduce(a + b + c),
    }


def fail_on(local_rank: int, bad_rank: int, how: str, marker: str | None = None) -> str:
    """Rank ``bad_rank`` fails in the way ``how`` says; the others block in a barrier."""
    ctx = idist.initialize()
    if marker is not None:
        Path(f"{marker}.{ctx.rank}").write_text(str(os.getpid()))
    if ctx.rank == bad_rank:
        time.sleep(0.5)
        if how == "raise":
            raise ValueError(f"boom from rank {ctx.rank}")
        if how == "exit3":
            sys.exit(3)
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if how == "os_exit0":
            os._exit(0)
        if how == "unpicklable":
            return lambda: None  # type: ignore[return-value]
    ctx.barrier()  # the healthy ranks wait here for the failed one, forever
    time.sleep(600)
    return "unreachable"


def sleeper(local_rank: int, marker: str, seconds: float = 600.0, how: str = "plain") -> None:
    """Write this rank's pid to ``marker.<local_rank>`` and sleep. ``how="stubborn"``: carry on
    through SIGTERM; ``"children"``: start a background ``sleep`` first (``marker.<local_rank>.child``)."""
    if how == "stubborn":
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
    if how == "children":
        child = subprocess.Popen(["sleep", "600"])
        Path(f"{marker}.{local_rank}.child").write_text(str(child.pid))
    Path(f"{marker}.{local_rank}").write_text(str(os.getpid()))
    time.sleep(seconds)


def with_child(local_rank: int, marker: str, fail_rank: int) -> int:
    """Start a background ``sleep`` (its pid in ``marker.<local_rank>.child``) and return, or raise
    on ``fail_rank`` (after the other rank has started its child)."""
    child = subprocess.Popen(["sleep", "600"])
    Path(f"{marker}.{local_rank}.child").write_text(str(child.pid))
    if local_rank == fail_rank:
        while not all(Path(f"{marker}.{r}.child").exists() for r in range(2)):
            time.sleep(0.01)
        raise ValueError(f"rank {local_rank} fails with a child running")
    return local_rank


def add(local_rank: int, x: int) -> int:
    return local_rank + x


def current_kind(local_rank: int, scale: int = 1) -> tuple[str, int, int, int]:
    ctx = idist.current()
    return (type(ctx).__name__, ctx.rank, ctx.world_size, local_rank * scale)


def raise_in_context(local_rank: int, bad_rank: int) -> None:
    """ignite's form: rank ``bad_rank`` raises, the others wait in a barrier."""
    if idist.get_rank() == bad_rank:
        raise ValueError(f"boom from rank {bad_rank}")
    idist.barrier()


def listeners(local_rank: int, initialize: bool = True) -> list[str]:
    """The local addresses this rank listens on (``ss``), once the group is up (``initialize``:
    spawn's torch.multiprocessing form, else the context is already there: ignite's form, Parallel)."""
    import subprocess

    if initialize:
        idist.initialize()
    idist.barrier()
    table = subprocess.run(["ss", "-tlnpH"], capture_output=True, text=True, check=False).stdout
    mine = [line.split()[3] for line in table.splitlines() if f"pid={os.getpid()}," in line]
    idist.barrier()
    if initialize:
        idist.finalize()
    return mine


def fail_then_peer_fails(local_rank: int, out: str) -> None:
    """Rank 1 raises at once; rank 0 raises its own error 0.3 s after rank 1 has ended, recording
    first that it got to (a rank's own report, as a peer's failure makes it fail too)."""
    gone = Path(out, "rank1-failed")
    if local_rank == 1:
        gone.write_text("")
        raise ValueError("rank 1 failed first")
    while not gone.exists():
        time.sleep(0.01)
    time.sleep(0.3)
    Path(out, "rank0-reported").write_text("")
    raise RuntimeError("rank 0 failed because rank 1 did")


def sees_mate_in_flight(local_rank: int) -> tuple[bool, bool]:
    """Rank 0 waits in a barrier; rank 1 looks at the launcher's stall marks until rank 0 shows in
    flight there, then joins it: (this rank has marks, rank 1 saw rank 0 in its call)."""
    from idist import _marks

    ctx = idist.current()
    marks = _marks.from_env(os.environ)
    seen = False
    if local_rank == 1 and marks is not None:
        deadline = time.monotonic() + 60
        while not seen and time.monotonic() < deadline:
            seen = 0 in marks.in_call(range(1, 100), "world", list(range(ctx.world_size)))
            time.sleep(0.02)
    ctx.barrier()
    return marks is not None, seen


def master_port_held(local_rank: int) -> bool:
    """Before anything binds this rank's MASTER_PORT: is it held for it (a plain bind refused)?"""
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", int(os.environ["MASTER_PORT"])))
        except OSError:
            return True
    return False
