"""The Horovod tests run only where horovod is installed (the lane's .venv-horovod)."""

from __future__ import annotations

import importlib.util


def _horovod_installed() -> bool:
    # tests/ is on sys.path (the shared harness lives there), so this very folder looks like a
    # namespace package called "horovod": only a real package, with an origin, counts.
    spec = importlib.util.find_spec("horovod")
    return spec is not None and spec.origin is not None


if not _horovod_installed():
    # Not collected without horovod (the main venv): scripts/lanes/horovod.sh runs them.
    collect_ignore_glob = ["test_*.py"]
