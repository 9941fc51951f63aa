"""Under a launcher: print the sockets this rank listens on (``ss``), once the group is up."""

from __future__ import annotations

import os
import subprocess

import idist

idist.initialize()
idist.barrier()
table = subprocess.run(["ss", "-tlnpH"], capture_output=True, text=True, check=False).stdout
print("\n".join(line for line in table.splitlines() if f"pid={os.getpid()}," in line), flush=True)
idist.barrier()
idist.finalize()
