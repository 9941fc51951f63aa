"""``spawn``/``Parallel`` with backend="horovod": the rank functions (``driven_cases``).

Run as a script it is the parent of a launch, for the tests that signal or kill the parent:
``python cases_spawn.py MARKER N`` spawns N Horovod ranks that write their pid and sleep.
"""

from __future__ import annotations

import sys

import idist
from driven_cases import fail_on, report, sleeper

__all__ = ["fail_on", "report", "sleeper"]


if __name__ == "__main__":
    idist.spawn("horovod", sleeper, (sys.argv[1],), nproc_per_node=int(sys.argv[2]))
