"""The Horovod tests run only where horovod is installed (the lane's .venv-horovod)."""

from __future__ import annotations

from launch_util import installed

if not installed("horovod"):
    # Not collected without horovod (the main venv): scripts/lanes/horovod.sh runs them.
    collect_ignore_glob = ["test_*.py"]
