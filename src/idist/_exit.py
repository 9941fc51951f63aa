"""Ending a process at once without leaving files behind.

``os._exit`` skips ``atexit``, and torch before 2.10 removes the folder it makes in the
temporary folder at ``import torch.distributed.nn`` (its remote-module template) only there:
each pool host or rank that ended with a bare ``os._exit`` left one in the user's ``TMPDIR``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn

#: the module of torch (< 2.10) whose ``_TEMP_DIR`` is a ``tempfile.TemporaryDirectory``
_TEMPLATE_MODULE = "torch.distributed.nn.jit.instantiator"


def flush_std() -> None:
    """Flush ``sys.stdout`` and ``sys.stderr``, whatever state they are in."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def remove_torch_temp_files() -> None:
    """Do now what torch's ``atexit`` would: remove its template folder if this process made one."""
    module = sys.modules.get(_TEMPLATE_MODULE)
    folder = getattr(module, "_TEMP_DIR", None)
    cleanup = getattr(folder, "cleanup", None)
    if callable(cleanup):
        with contextlib.suppress(OSError):
            cleanup()


def exit_now(code: int) -> NoReturn:
    """Flush stdio, remove torch's temporary files, then ``os._exit(code)``: no interpreter
    teardown (seconds for torch on a loaded machine), no thread is waited for."""
    remove_torch_temp_files()
    flush_std()
    os._exit(code)
