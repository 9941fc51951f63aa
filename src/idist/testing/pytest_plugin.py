"""pytest plugin: the ``simulated_world`` fixture (registered through the ``pytest11`` entry point).

::

    def test_mean(simulated_world):                  # 2 ranks by default
        assert simulated_world.run(my_metric) == [1.5, 1.5]

    @pytest.mark.simulated_world(4, timeout=30)      # 4 ranks, 30 s per run (checked=False: unchecked)
    def test_gather(simulated_world): ...

The marker takes ``(world_size=2, timeout=60.0, checked=True, share_args=False)``. The fixture
is a ``SimulatedWorld``, closed after the test; parametrize it indirectly for several sizes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from idist.testing import SimulatedWorld  # deferred: pytest loads this plugin in every session

MARKER = "simulated_world"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(world_size=2, timeout=60.0, checked=True, share_args=False): size, per-run timeout "
        "(seconds), checked mode and argument sharing of the simulated_world fixture",
    )


def _marker_options(
    world_size: object = 2, timeout: object = None, checked: object = True, *, share_args: object = False
) -> tuple[object, object, object, object]:
    """The marker's arguments as ``SimulatedWorld`` takes them (positional or by name)."""
    return world_size, timeout, checked, share_args


def _options(request: pytest.FixtureRequest) -> tuple[int, float, bool, bool]:
    from idist.testing import DEFAULT_TIMEOUT  # deferred: pytest loads this plugin in every session

    world_size: object = 2
    timeout: object = None
    checked: object = True
    share_args: object = False
    marker = request.node.get_closest_marker(MARKER)
    if marker is not None:
        try:
            world_size, timeout, checked, share_args = _marker_options(*marker.args, **marker.kwargs)
        except TypeError as exc:
            raise pytest.UsageError(
                f"@pytest.mark.{MARKER}: {exc}; it takes (world_size=2, timeout=60.0, checked=True, share_args=False)"
            ) from None
    param = getattr(request, "param", None)
    if param is not None:
        world_size = param
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise pytest.UsageError(f"{MARKER}: world_size must be an int >= 1, got {world_size!r}")
    for name, flag in (("checked", checked), ("share_args", share_args)):
        if not isinstance(flag, bool):
            raise pytest.UsageError(f"{MARKER}: {name} must be True or False, got {flag!r}")
    seconds = DEFAULT_TIMEOUT if timeout is None else timeout
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise pytest.UsageError(f"{MARKER}: timeout must be a positive number of seconds, got {timeout!r}")
    return world_size, float(seconds), bool(checked), bool(share_args)


@pytest.fixture
def simulated_world(request: pytest.FixtureRequest) -> Iterator[SimulatedWorld]:
    """A world of simulated ranks for this test (2 by default; see the module docstring)."""
    from idist.testing import SimulatedWorld  # deferred: pytest loads this plugin in every session

    world_size, timeout, checked, share_args = _options(request)
    with SimulatedWorld(world_size, timeout=timeout, checked=checked, share_args=share_args) as world:
        yield world
