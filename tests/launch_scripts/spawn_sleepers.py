"""Spawn N ranks that write their pids to MARKER.<local_rank> and sleep (Ctrl-C / kill tests).

Usage: python spawn_sleepers.py MARKER N
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import idist
from launch_fns import sleeper

if __name__ == "__main__":
    idist.spawn(sleeper, args=(sys.argv[1],), nprocs=int(sys.argv[2]))
