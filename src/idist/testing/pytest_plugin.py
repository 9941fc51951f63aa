"""pytest plugin: the ``simulated_world`` fixture (registered through the ``pytest11`` entry point).

::

    def test_mean(simulated_world):                  # 2 ranks by default
        assert simulated_world.run(my_metric) == [1.5, 1.5]

    @pytest.mark.simulated_world(4, timeout=30)      # 4 ranks, 30 s per run (checked=False: unchecked)
    def test_gather(simulated_world): ...

The fixture is a ``SimulatedWorld``, closed after the test; parametrize it indirectly
for several sizes. Nothing heavy is imported until a test asks for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from idist.testing import SimulatedWorld  # deferred: pytest loads this plugin in every session

MARKER = "simulated_world"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(world_size=2, timeout=60.0, checked=True): size, per-run timeout (seconds) and checked "
        "mode of the simulated_world fixture",
    )


def _options(request: pytest.FixtureRequest) -> tuple[int, float, bool]:
    from idist.testing import DEFAULT_TIMEOUT  # deferred: pytest loads this plugin in every session

    world_size: object = 2
    timeout: Any = DEFAULT_TIMEOUT
    marker = request.node.get_closest_marker(MARKER)
    if marker is not None:
        world_size = marker.kwargs.get("world_size", marker.args[0] if marker.args else world_size)
        timeout = marker.kwargs.get("timeout", marker.args[1] if len(marker.args) > 1 else timeout)
    checked = bool(marker.kwargs.get("checked", True)) if marker is not None else True
    param = getattr(request, "param", None)
    if param is not None:
        world_size = param
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise pytest.UsageError(f"simulated_world: world_size must be an int >= 1, got {world_size!r}")
    return world_size, float(timeout), checked


@pytest.fixture
def simulated_world(request: pytest.FixtureRequest) -> Iterator[SimulatedWorld]:
    """A world of simulated ranks for this test (2 by default; see the module docstring)."""
    from idist.testing import SimulatedWorld  # deferred: pytest loads this plugin in every session

    world_size, timeout, checked = _options(request)
    with SimulatedWorld(world_size, timeout=timeout, checked=checked) as world:
        yield world
