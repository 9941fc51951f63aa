"""A rank of ``idist run`` for the Unix behaviours of the launcher (tests/test_launch_unix.py).

Standard library only (no torch: each rank starts in milliseconds). Usage: ``unix_rank.py MODE MARK [N]``,
where ``MARK.<rank>...`` are files the test reads:

* ``burst MARK N``: N lines of 80 bytes on stdout, then ``LAST LINE <rank>``; then ``MARK.<rank>.done``.
* ``children MARK``: a ``sleep`` in the background (pid in ``MARK.<rank>.child``); rank 0 also a
  detached one (``start_new_session=True``, holding stdout: ``MARK.0.detached``); then rank 0
  exits 0, and rank 1 raises once ``MARK.go`` exists.
* ``sleepers MARK``: a background ``sleep`` each (``MARK.<rank>.child``), then sleep (kill tests).
* ``progress MARK``: ``\\rstep 1`` on stderr, unended, until ``MARK.go`` exists, then ``\\rstep 2\\n``.
* ``stdin MARK``: rank 0 asks ``name? `` and greets; every rank says what its stdin is.
* ``pdb MARK``: ``breakpoint()`` on every rank, then ``after <rank>``.
* ``pieces MARK``: rank 0 writes a line in two pieces with rank 1's line in between.
* ``raise MARK``: every rank raises (``x = 5 + rank`` first), rank 1 after rank 0 did.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

mode, mark = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
Path(f"{mark}.{rank}").write_text(str(os.getpid()))


def background(name: str, **kw: object) -> None:
    child = subprocess.Popen(["sleep", "600"], **kw)  # type: ignore[call-overload]
    # written whole, then renamed: a test that sees the file reads the pid, never an empty file
    part = Path(f"{mark}.{rank}.{name}.part")
    part.write_text(str(child.pid))
    part.rename(f"{mark}.{rank}.{name}")


if mode == "burst":
    for i in range(int(sys.argv[3])):
        print(f"line {i:06d} of rank {rank} " + "x" * 58)
    print(f"LAST LINE {rank}")
    sys.stdout.flush()
    Path(f"{mark}.{rank}.done").touch()
elif mode == "children":
    background("child", stdout=subprocess.DEVNULL)
    if rank == 0:
        background("detached", start_new_session=True)  # keeps the rank's stdout open
        sys.exit(0)
    deadline = time.monotonic() + 60
    while not Path(f"{mark}.go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    raise RuntimeError("rank 1 fails after starting a child")
elif mode == "sleepers":
    background("child", stdout=subprocess.DEVNULL)
    time.sleep(600)
elif mode == "progress":
    sys.stderr.write("\rstep 1")
    sys.stderr.flush()
    deadline = time.monotonic() + 60
    while not Path(f"{mark}.go").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    sys.stderr.write("\rstep 2\n")
elif mode == "stdin":
    null = os.stat(os.devnull)
    mine = os.fstat(0)
    is_null = stat.S_ISCHR(mine.st_mode) and mine.st_rdev == null.st_rdev
    print(f"rank {rank} stdin: {'/dev/null' if is_null else 'terminal' if os.isatty(0) else 'a pipe or file'}")
    if rank == 0 and not is_null:
        print(f"hello {input('name? ')}")
elif mode == "pieces":
    if rank == 0:
        sys.stdout.write("first half")
        sys.stdout.flush()
        deadline = time.monotonic() + 60
        while not Path(f"{mark}.1.done").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # rank 1's line is out by now
        sys.stdout.write(", second half\n")
    else:
        while not Path(f"{mark}.0").exists():
            time.sleep(0.01)
        time.sleep(0.3)
        print("a line of rank 1", flush=True)
        Path(f"{mark}.1.done").touch()
elif mode == "raise":
    x = 5 + rank
    if rank == 1:
        while not Path(f"{mark}.0.raising").exists():
            time.sleep(0.01)
        time.sleep(0.5)  # rank 0 has failed, and its launcher has seen it
    Path(f"{mark}.{rank}.raising").touch()
    raise ValueError(f"rank {rank} fails")
elif mode == "pdb":
    x = 6 + rank
    breakpoint()
    print(f"after {rank}")
