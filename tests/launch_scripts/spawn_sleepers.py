"""Spawn N ranks that write their pids to MARKER.<local_rank> and sleep (Ctrl-C / kill tests).

Usage: python spawn_sleepers.py MARKER N [plain|stubborn|children]
  stubborn: the ranks carry on through SIGTERM; children: each also starts a background ``sleep``
  (its pid in MARKER.<local_rank>.child)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import idist
from launch_fns import sleeper

if __name__ == "__main__":
    how = sys.argv[3] if len(sys.argv) > 3 else "plain"
    idist.spawn(sleeper, args=(sys.argv[1], 600.0, how), nprocs=int(sys.argv[2]))
