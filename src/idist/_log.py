"""Loggers whose records a user sees even when nothing configured logging (as ignite's do).

``visible_logger(name)`` returns ``logging.getLogger(name)`` at INFO (unless the user set a
level on it) with a fallback handler that writes to ``sys.stderr`` as it is when the record is
written (as ``logging.lastResort`` does: pytest's ``capsys`` and redirections see it) only while
no other handler in the logger's chain would show the record, so a fresh script sees
``show_config()`` and a configured application gets each record once, through its own handlers
(pytest's log capture keeps records for its report only: it does not count). Records carrying
``extra={"idist_rank": r}`` with ``r != 0`` stay silent in the fallback (rank 0 speaks).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"


class _Fallback(logging.StreamHandler[TextIO]):
    """Writes a record to stderr when no other handler would show it."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter(FORMAT))

    def handle(self, record: logging.LogRecord) -> bool:
        if getattr(record, "idist_rank", 0) != 0 or _others(logging.getLogger(record.name), self):
            return False
        return super().handle(record)

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stderr  # the stream of now, under the handler's lock (pytest's capsys swaps it)
        if stream is None:  # no console at all (pythonw)
            return
        self.stream = stream
        super().emit(record)


def _shows(handler: logging.Handler) -> bool:
    """Whether ``handler`` shows records to someone (a null handler, a file handler writing to the
    null device, and pytest's capture, which keeps records for its report only, do not)."""
    if isinstance(handler, logging.NullHandler):
        return False
    if isinstance(handler, logging.FileHandler) and handler.baseFilename == os.devnull:
        return False
    cls = type(handler)
    return not (cls.__name__ == "LogCaptureHandler" and cls.__module__.startswith("_pytest"))


def _others(logger: logging.Logger, mine: logging.Handler) -> bool:
    """Whether any handler but ``mine`` that shows records is on ``logger`` or an ancestor it propagates to."""
    current: logging.Logger | None = logger
    while current is not None:
        if any(h is not mine and _shows(h) for h in current.handlers):
            return True
        current = current.parent if current.propagate else None
    return False


_FALLBACK = _Fallback()


def visible_logger(name: str) -> logging.Logger:
    """``name``'s logger, set up so that its INFO records are seen (see the module docstring)."""
    logger = logging.getLogger(name)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if _FALLBACK not in logger.handlers:
        logger.addHandler(_FALLBACK)
    return logger
