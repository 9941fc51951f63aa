"""Spawn N ranks that write their pids to MARKER.<local_rank> and sleep (Ctrl-C / kill tests).

Usage: python spawn_sleepers.py MARKER N [plain|stubborn|children|ctrl-c-at-start]
  stubborn: the ranks carry on through SIGTERM; children: each also starts a background ``sleep``
  (its pid in MARKER.<local_rank>.child); ctrl-c-at-start: a Ctrl-C comes the moment the last rank's
  process has started, before ``spawn`` has taken note of it (each started pid in MARKER.started.<i>)
"""

from __future__ import annotations

import os
import signal
import sys
from multiprocessing.process import BaseProcess
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import idist
from launch_fns import sleeper


def ctrl_c_when_started(marker: str, n: int) -> None:
    """A real SIGINT to this process as ``Process.start`` returns for the last rank: the worst
    moment a user's Ctrl-C can come, made certain."""
    start = BaseProcess.start
    started: list[int] = []

    def start_then_ctrl_c(self: BaseProcess) -> None:
        start(self)
        assert self.pid is not None
        Path(f"{marker}.started.{len(started)}").write_text(str(self.pid))
        started.append(self.pid)
        if len(started) == n:
            os.kill(os.getpid(), signal.SIGINT)

    BaseProcess.start = start_then_ctrl_c  # type: ignore[method-assign]


if __name__ == "__main__":
    how = sys.argv[3] if len(sys.argv) > 3 else "plain"
    if how == "ctrl-c-at-start":
        ctrl_c_when_started(sys.argv[1], int(sys.argv[2]))
    idist.spawn(sleeper, args=(sys.argv[1], 600.0, how), nprocs=int(sys.argv[2]))
