"""Public names that load on first use, so that importing a package costs no torch import.

``idist`` and ``idist.launch`` list their names in ``__all__`` and keep the imports that
define them in an ``_api`` module. Type checkers read those imports (under ``TYPE_CHECKING``);
at run time the first name asked for imports ``_api`` once and binds every name. ``idist run``
and ``idist --help`` therefore start without torch (the launcher only starts processes), while
``import idist; idist.initialize(...)`` works as before.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, MutableMapping, Sequence


def exports(
    namespace: MutableMapping[str, object], api: str, names: Sequence[str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__``: ``names`` come from module ``api`` (relative to
    the package) on first use; any other name is one of its submodules, or an ``AttributeError``."""
    package = str(namespace["__name__"])

    def __getattr__(name: str) -> object:
        if name not in names:
            return _submodule(package, name)
        module = importlib.import_module(api, package)
        for key in names:
            namespace.setdefault(key, getattr(module, key))  # a name the caller already set stays
        return namespace[name]

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__


def _submodule(package: str, name: str) -> object:
    """``package.name`` imported (``import idist`` used to make ``idist.training`` and the other
    submodules attributes by importing them), or ``AttributeError`` when there is no such module."""
    missing = AttributeError(f"module {package!r} has no attribute {name!r}")
    if name.startswith("__"):
        raise missing
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{package}.{name}":
            raise
        raise missing from None
