"""Two ranks that fail together, the wrong one out first: rank 1 raises at once but takes
``SLOW`` seconds to exit (its exit hooks are slow, as a torch process's can be under load);
rank 0 then ends as a rank whose peer stopped answering ends, and is out first."""

from __future__ import annotations

import atexit
import os
import sys
import time

SLOW = 3.0

if __name__ == "__main__":
    if os.environ["RANK"] == "1":
        atexit.register(time.sleep, SLOW)
        raise RuntimeError("rank 1 raised first")
    time.sleep(0.5)
    print("idist.PeerLostError: ranks [1] stopped answering", file=sys.stderr, flush=True)
    sys.exit(1)
