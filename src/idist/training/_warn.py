"""Warnings about a training setup, attributed to the user's line rather than to idist's frames."""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType

#: idist's own source folder: frames inside it are skipped
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def warn(message: str) -> None:
    """A ``UserWarning`` at the first caller outside idist (shown once per line by Python's filters)."""
    frame: FrameType | None = sys._getframe(1)
    level = 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, UserWarning, stacklevel=level)
