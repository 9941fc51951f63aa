"""Test distributed code without a cluster: simulated ranks, a process pool, a pytest plugin.

``simulate(world_size, fn, *args)`` runs ``fn(ctx, *args)`` once per rank, each rank a
thread whose gloo-like groups meet the other ranks' in memory (no socket per pair).
``SimulatedWorld`` keeps such a world between runs; ``ProcessWorld`` does the same with
real processes. Both are *runners* (``Runner``): ``run(fn, *args) -> list`` of results in
rank order. The property suite (``properties/``) takes its runners from
``IDIST_PROPERTY_RUNNER`` (``runners_from_env``), so other backends plug in their own.
The pytest plugin (``idist.testing.pytest_plugin``, loaded automatically by pytest) gives
tests a ``simulated_world`` fixture.
"""

from __future__ import annotations

from ._errors import RankFailedError, WorldTimeoutError
from ._jobs import RemoteError
from ._processes import ProcessWorld
from ._runners import Runner, RunnerFactory, RunnerSpec, register_runner, runners_from_env
from ._threads import DEFAULT_TIMEOUT, SimulatedWorld, simulate

__all__ = [
    "DEFAULT_TIMEOUT",
    "ProcessWorld",
    "RankFailedError",
    "RemoteError",
    "Runner",
    "RunnerFactory",
    "RunnerSpec",
    "SimulatedWorld",
    "WorldTimeoutError",
    "register_runner",
    "runners_from_env",
    "simulate",
]
