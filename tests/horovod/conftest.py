"""The Horovod tests run only where horovod is installed (the lane's .venv-horovod)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if importlib.util.find_spec("horovod") is not None:
        return
    skip = pytest.mark.skip(reason="horovod is not installed here; scripts/lanes/horovod.sh runs these")
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(skip)
