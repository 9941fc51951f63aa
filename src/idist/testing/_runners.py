"""The *runner* abstraction the property suite is written against, and how runners are chosen.

A runner runs ``fn(ctx, *args)`` on every rank of a world and returns the results in rank
order, so the same properties run on threads, processes and any backend a lane plugs in.
``IDIST_PROPERTY_RUNNER`` is a comma-separated list of ``NAME@WORLD_SIZE`` (default size
2); ``NAME`` is ``threads``, ``processes``, a name given to ``register_runner``, or an
import path ``package.module:factory`` (called as ``factory(world_size)``). Rank functions
are module-level and their arguments and results pickle; a runner may rely on that.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar, final, runtime_checkable

import attrs
from typing_extensions import TypeVarTuple, Unpack

from .._context import DistContext
from ._processes import ProcessWorld
from ._threads import SimulatedWorld

R = TypeVar("R")
Ts = TypeVarTuple("Ts")

ENV_VAR = "IDIST_PROPERTY_RUNNER"
#: what the property suite runs on when ``IDIST_PROPERTY_RUNNER`` is not set
DEFAULT_SPEC = "threads@1,threads@2,threads@4,processes@3"


@runtime_checkable
class Runner(Protocol):
    """Runs a function on every rank of a world; see the module docstring."""

    @property
    def world_size(self) -> int: ...

    @property
    def name(self) -> str:
        """A short label for test ids, e.g. ``threads@4``."""
        ...

    def run(self, fn: Callable[[DistContext, Unpack[Ts]], R], *args: *Ts) -> list[R]:
        """Call ``fn(ctx, *args)`` on every rank; the results in rank order.

        A rank that raises makes ``run`` raise (``RankFailedError`` naming the rank for the
        built-in runners); a run never hangs past the runner's timeout.
        """
        ...

    def close(self) -> None:
        """Release the world (threads, processes). Safe to call twice."""
        ...


RunnerFactory = Callable[[int], Runner]

_REGISTRY: dict[str, RunnerFactory] = {
    "threads": lambda n: SimulatedWorld(n),
    "processes": lambda n: ProcessWorld(n),
}


def register_runner(name: str, factory: RunnerFactory) -> None:
    """Make ``name`` usable in ``IDIST_PROPERTY_RUNNER`` (``factory(world_size) -> Runner``)."""
    if not name.isidentifier():
        raise ValueError(f"runner name must be an identifier, got {name!r}")
    _REGISTRY[name] = factory


@final
@attrs.frozen
class RunnerSpec:
    """One entry of ``IDIST_PROPERTY_RUNNER``: what to build, not yet built."""

    name: str
    world_size: int
    factory: RunnerFactory = attrs.field(repr=False)

    @property
    def label(self) -> str:
        return f"{self.name}@{self.world_size}"

    def build(self) -> Runner:
        return self.factory(self.world_size)


def _factory(name: str) -> RunnerFactory:
    if name in _REGISTRY:
        return _REGISTRY[name]
    module, sep, attr = name.partition(":")
    if not sep or not module or not attr:
        raise ValueError(
            f"{ENV_VAR}: unknown runner {name!r}; use one of {', '.join(sorted(_REGISTRY))} "
            "or an import path 'package.module:factory'"
        )
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{ENV_VAR}: {name!r} is not callable")
    factory: RunnerFactory = obj
    return factory


def parse_runners(spec: str) -> list[RunnerSpec]:
    """Parse ``NAME@N,NAME@N,...`` (see the module docstring); raises ``ValueError``."""
    out: list[RunnerSpec] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, size = item.rpartition("@")
        if not sep:
            name, size = item, "2"
        try:
            n = int(size)
        except ValueError:
            raise ValueError(f"{ENV_VAR}: world size in {item!r} must be an integer") from None
        if n < 1:
            raise ValueError(f"{ENV_VAR}: world size in {item!r} must be >= 1")
        out.append(RunnerSpec(name, n, _factory(name)))
    if not out:
        raise ValueError(f"{ENV_VAR} names no runner; e.g. {DEFAULT_SPEC!r}")
    return out


def runners_from_env(environ: Mapping[str, str] | None = None) -> list[RunnerSpec]:
    """The runners named by ``IDIST_PROPERTY_RUNNER``, else ``DEFAULT_SPEC``."""
    env = environ if environ is not None else os.environ
    return parse_runners(env.get(ENV_VAR, "") or DEFAULT_SPEC)
