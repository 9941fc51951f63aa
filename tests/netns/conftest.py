"""Fixtures for the namespace tests: fresh nodes per test, always torn down; skip where impossible."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from netns_harness import NodeNet, skip_reason


def _net(tmp_path: Path, n: int) -> NodeNet:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    return NodeNet(n, tmp_path / "net")


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[NodeNet]:
    """Two nodes on one bridge (node0 and node1); everything on them is killed and deleted afterwards."""
    with _net(tmp_path, 2) as net:
        yield net


@pytest.fixture
def nodes4(tmp_path: Path) -> Iterator[NodeNet]:
    """Four nodes on one bridge: two 2-node jobs side by side, a fault on one pair only."""
    with _net(tmp_path, 4) as net:
        yield net
