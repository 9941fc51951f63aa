"""A rank under horovodrun (``idist run --backend horovod``): write its pid to ``MARK.<rank>`` and
the pid of a background ``sleep`` to ``MARK.<rank>.child``, then sleep (the kill tests)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

mark, rank = sys.argv[1], os.environ["HOROVOD_RANK"]
child = subprocess.Popen(["sleep", "600"])
Path(f"{mark}.{rank}.child").write_text(str(child.pid))
Path(f"{mark}.{rank}").write_text(str(os.getpid()))
time.sleep(600)
