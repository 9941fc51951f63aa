"""Reports from ranks that another launcher starts (``horovod.run``, ``torch_xla.launch``).

Those launchers start the ranks themselves, so there is no pipe from each rank as in
``_procs``. Instead each rank writes what its launch needs into a private folder
(``tempfile.mkdtemp``, mode 0700) that the parent makes for this launch and removes after
it, whatever became of the launcher process: ``ok-R``
(rank R's return value) or ``error-R`` (a ``RankError``) when ``fn`` ends. A file appears
whole or not at all (written beside, then renamed). They are read once the launcher has
returned or failed; the first failure in time is the one to blame (the others are
usually its consequences: peers that lost the failed rank in a collective).
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Literal, TypeAlias, final

import attrs

from .._backends.native._board import pid_alive
from .._errors import LaunchConfigError, LaunchError
from ._child import _summary

Kind: TypeAlias = Literal["ok", "error"]


@attrs.frozen
class RankError:
    """What a rank reports when ``fn`` raised (the fields ``_child`` sends up its pipe)."""

    rank: int
    local_rank: int
    #: the exception's class name (``LaunchConfigError`` is re-raised as such by the parent)
    kind: str
    summary: str
    traceback: str
    when: float
    exitcode: int = 1


@final
@attrs.frozen
class Reporter:
    """The rank's side: a picklable handle on the launch's folder."""

    path: str

    def _write(self, kind: Kind, rank: int, value: object) -> None:
        target = Path(self.path, f"{kind}-{rank}")
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def error(self, rank: int, local_rank: int, exc: BaseException, when: float, exitcode: int = 1) -> None:
        """Report ``exc`` as rank ``rank``'s failure, raised at time ``when``."""
        tb = "".join(traceback.format_exception(exc))
        err = RankError(rank, local_rank, type(exc).__qualname__, _summary(exc), tb, when, exitcode)
        self._write("error", rank, err)

    def result(self, rank: int, local_rank: int, value: object) -> bool:
        """Report ``fn``'s return value; False (and an error report) when it does not pickle."""
        try:
            self._write("ok", rank, value)
        except Exception as exc:
            text = (
                f"fn returned a {type(value).__qualname__} that cannot be sent to the parent ({_summary(exc)}); "
                "return None or a picklable value"
            )
            tb = "".join(traceback.format_exception(exc))
            self._write("error", rank, RankError(rank, local_rank, "LaunchError", text, tb, time.time()))
            return False
        return True


_PREFIX = "idist-launch-"


def _sweep_stale() -> None:
    """Remove the folders of launches whose parent died without removing them (SIGKILL)."""
    root = Path(tempfile.gettempdir())
    for entry in root.glob(f"{_PREFIX}*-*"):
        pid = entry.name[len(_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)) and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)


@final
class ReportFolder:
    """The launch's side: reads what the ranks wrote.

    ``ReportFolder()`` makes the folder and removes it on close (the parent, which outlives
    the launcher process even when that is killed); ``ReportFolder(path)`` reads one made
    elsewhere and leaves it.
    """

    def __init__(self, path: str | None = None) -> None:
        self._owned = path is None
        if path is None:
            _sweep_stale()
            path = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-")
        self.path = path
        self.reporter = Reporter(self.path)

    def read(self, kind: Kind) -> dict[int, object]:
        out: dict[int, object] = {}
        for entry in os.scandir(self.path):
            name, sep, rank = entry.name.partition("-")
            if name != kind or not sep or not rank.isdigit():
                continue
            try:
                out[int(rank)] = pickle.loads(Path(entry.path).read_bytes())
            except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
                continue  # a value this process cannot load is no report
        return out

    def errors(self) -> dict[int, RankError]:
        return {r: e for r, e in self.read("error").items() if isinstance(e, RankError)}

    def first_error(self) -> RankError | None:
        """The failure that happened first."""
        return earliest(self.errors().values())

    def results(self, world_size: int, launcher: str) -> list[object]:
        """Every rank's return value in rank order, or ``LaunchError`` naming the missing ranks."""
        done = self.read("ok")
        missing = [r for r in range(world_size) if r not in done]
        if missing:
            raise LaunchError(
                f"{launcher} finished, but rank(s) {', '.join(map(str, missing))} reported no result "
                "(did fn call os._exit?)",
                rank=missing[0],
            )
        return [done[r] for r in range(world_size)]

    def close(self) -> None:
        if self._owned:
            shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> ReportFolder:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def earliest(errors: Iterable[RankError]) -> RankError | None:
    """The failure that happened first, or None for none."""
    return min(errors, key=lambda e: e.when, default=None)


def rank_failure(err: RankError, world_size: int) -> LaunchError:
    """The ``LaunchError`` for ``err``, worded as ``_procs`` words a failed rank."""
    text = f"rank {err.rank} (local rank {err.local_rank}) failed: {err.summary}"
    if err.kind == "LaunchConfigError":
        # raised by the launch's own checks inside the rank: the summary says what to do
        return LaunchConfigError(err.summary.removeprefix("LaunchConfigError: "), rank=err.rank)
    text += f"\n\n--- traceback of rank {err.rank} ---\n{err.traceback.rstrip()}"
    others = [r for r in range(world_size) if r != err.rank]
    if others:
        text += f"\n\nthe other ranks ({', '.join(map(str, others))}) were stopped"
    return LaunchError(text, rank=err.rank, local_rank=err.local_rank, exitcode=err.exitcode, traceback=err.traceback)
