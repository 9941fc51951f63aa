"""Changing this process's environment, and giving it back as it was.

One shape for every change idist makes to ``os.environ``: a mapping from a variable to its
new value, where ``None`` removes the variable. ``apply`` returns the change that undoes it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

#: variable -> its new value; None removes the variable
EnvChanges = Mapping[str, "str | None"]


def apply(changes: EnvChanges) -> dict[str, str | None]:
    """Set (or, for ``None``, remove) each variable; return the changes that give them back."""
    before = {name: os.environ.get(name) for name in changes}
    for name, value in changes.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return before


@contextmanager
def changed(changes: EnvChanges) -> Iterator[None]:
    """``changes`` for the block only: each variable it names is as it was after."""
    before = apply(changes)
    try:
        yield
    finally:
        apply(before)


@contextmanager
def kept() -> Iterator[None]:
    """The whole environment as it was after the block, whatever the block (or code it calls,
    such as torch's elastic agent) set or removed."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
