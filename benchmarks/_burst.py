"""A rank for bench_launch.py's output workload: LINES lines of 80 bytes, one write each (as a
logger that flushes every record does). Standard library only: the launcher's cost is measured."""

from __future__ import annotations

import os
import sys

text = f"rank {os.environ.get('RANK', '0')} " + "x" * 62
for i in range(int(sys.argv[1])):
    print(f"{i:08d} {text}", flush=True)
