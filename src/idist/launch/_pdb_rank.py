"""The rank that ``idist run --pdb-rank R`` debugs: ``python -u _pdb_rank.py [-m] target args...``.

Runs the script (or ``-m`` module) as ``python`` would, as ``__main__`` with its own
``sys.argv`` and ``sys.path[0]``; ``breakpoint()`` stops in pdb, and an uncaught exception
prints its traceback and opens pdb's post-mortem on it (quit with ``q``; the rank then exits 1).
Standard library only: it runs by path, before anything of idist is imported.
"""

from __future__ import annotations

import bdb
import os
import pdb
import runpy
import sys
import traceback


def main(argv: list[str]) -> int:
    module = argv[:1] == ["-m"]
    target, args = (argv[1], argv[2:]) if module else (argv[0], argv[1:])
    sys.argv = [target, *args]
    try:
        if module:
            sys.path[0] = os.getcwd()  # as python -m puts it
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
    except SystemExit:
        raise
    except bdb.BdbQuit:
        return 1  # quit from a breakpoint
    except BaseException as exc:
        assert exc.__traceback__ is not None
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)  # from runpy on, as python's
        sys.stdout.flush()
        print("idist run --pdb-rank: uncaught exception; post-mortem debugging (q quits)", file=sys.stderr, flush=True)
        pdb.post_mortem(exc.__traceback__)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
