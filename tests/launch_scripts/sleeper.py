"""Under a launcher: write this rank's pid to MARKER.<LOCAL_RANK>, then sleep (kill tests).

Usage: python sleeper.py MARKER
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

Path(f"{sys.argv[1]}.{os.environ['LOCAL_RANK']}").write_text(str(os.getpid()))
time.sleep(600)
