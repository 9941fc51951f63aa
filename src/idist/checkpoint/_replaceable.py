"""What a save may replace: nothing, an empty folder, or a checkpoint; never the user's files.

A checkpoint is a folder that holds DCP's ``.metadata`` and only the files a checkpoint holds
(``_files.is_checkpoint_file``): DCP's and idist's. Anything else at the path (a file, a
symbolic link, a folder with other entries or without ``.metadata``) and the folders a
running process depends on (the working folder, a folder above it or above the running
script) raise ``CheckpointPathError`` before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from pathlib import Path

from .._errors import CheckpointPathError
from . import _files

#: entries named in the error before the rest are counted
_SHOWN = 5
_WAY_OUT = "save to a new or empty folder, or to a checkpoint's (a save replaces the folder at its path whole)"


def _real(path: Path | str) -> Path:
    return Path(os.path.realpath(path))


def _scripts() -> list[Path]:
    """The running script, as ``__main__`` and ``sys.argv`` name it (none for ``python -c``)."""
    main = sys.modules.get("__main__")
    candidates = (getattr(main, "__file__", None), sys.argv[0] if sys.argv else "")
    return [_real(c) for c in candidates if isinstance(c, str) and c and os.path.isfile(c)]


def _names(entries: list[str]) -> str:
    shown = ", ".join(sorted(entries)[:_SHOWN])
    more = f" and {len(entries) - _SHOWN} more" if len(entries) > _SHOWN else ""
    return f"{shown}{more}"


def check(path: Path) -> None:
    """``CheckpointPathError`` unless a save may publish a checkpoint at ``path`` (replacing what is there)."""
    real, cwd = _real(path), _real(os.getcwd())
    if real == cwd:
        raise CheckpointPathError(
            f"{path} is the working folder of this process: a save replaces its folder whole, so it never "
            f"saves there; save into a folder of its own, such as {path / 'checkpoint'}"
        )
    if cwd.is_relative_to(real):
        raise CheckpointPathError(
            f"{path} holds the working folder of this process ({cwd}): a save replaces its folder whole; save "
            "into a folder of its own"
        )
    script = next((s for s in _scripts() if s.is_relative_to(real)), None)
    if script is not None:
        raise CheckpointPathError(
            f"{path} holds the running script {script}: a save replaces its folder whole; save into a folder of its own"
        )
    # one lstat, then one listing: another save may publish at ``path`` between two looks (a
    # checkpoint renamed away is gone, not a file)
    try:
        mode = os.lstat(path).st_mode
        with os.scandir(path) if stat.S_ISDIR(mode) else contextlib.nullcontext(()) as found:
            plain = {e.name: e.is_file(follow_symlinks=False) for e in found}  # types from the listing
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise CheckpointPathError(f"{path} is a symbolic link, which a save would replace: save to its target")
    if not stat.S_ISDIR(mode):
        raise CheckpointPathError(f"{path} is a file, not a checkpoint folder: {_WAY_OUT}")
    entries = list(plain)
    foreign = [e for e in entries if not _files.is_checkpoint_file(e) or not plain[e]]
    if foreign:
        raise CheckpointPathError(
            f"{path} is not a checkpoint: it holds {len(foreign)} entries no checkpoint holds "
            f"({_names(foreign)}), and a save never removes them; {_WAY_OUT}"
        )
    if entries and _files.DCP_METADATA not in entries:
        raise CheckpointPathError(
            f"{path} is not a checkpoint: it holds {_names(entries)} but no {_files.DCP_METADATA}; {_WAY_OUT}"
        )
