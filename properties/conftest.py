"""Runners and hypothesis profiles for the property suite (see properties/README.md).

``runner`` is a session-scoped fixture, parametrized over ``IDIST_PROPERTY_RUNNER``
(default: simulated threads at 1, 2 and 4 ranks and a pool of 3 gloo processes); each
world starts once and serves every property.

Profiles: ``idist`` (default), ``ci`` (chosen when ``CI`` is set: same example counts,
derandomized so a CI run is reproducible), ``thorough`` (10x the examples); pick one with
``IDIST_HYPOTHESIS_PROFILE``. No profile writes an example database (nothing left behind).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from idist.testing import Runner, RunnerSpec, runners_from_env

_common = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile("idist", max_examples=40, **_common)  # type: ignore[arg-type]
settings.register_profile("ci", max_examples=40, derandomize=True, print_blob=True, **_common)  # type: ignore[arg-type]
settings.register_profile("thorough", max_examples=300, **_common)  # type: ignore[arg-type]
settings.load_profile(os.environ.get("IDIST_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "idist"))

SPECS = runners_from_env()


@pytest.fixture(scope="session", params=SPECS, ids=[s.label for s in SPECS])
def runner(request: pytest.FixtureRequest) -> Iterator[Runner]:
    spec: RunnerSpec = request.param
    world = spec.build()
    try:
        yield world
    finally:
        world.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Properties on a runner other than simulated threads are ``slow`` (the process pool
    costs ~20 s of the suite's ~40 s); the quick tier runs them on threads only."""
    for item in items:
        callspec = getattr(item, "callspec", None)  # a pytest.Function's parametrization
        spec = callspec.params.get("runner") if callspec is not None else None
        if isinstance(spec, RunnerSpec) and spec.name != "threads":
            item.add_marker(pytest.mark.slow)
