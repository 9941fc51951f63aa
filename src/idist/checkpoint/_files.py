"""A checkpoint's files: their names, durable writes, the probe, and the checks a load makes on the folder.

A checkpoint is a folder holding DCP's ``.metadata`` and nothing but a checkpoint's files
(``is_checkpoint_file``). A load reads the folder through a handle held open
(``pinned``), so a save that replaces the path meanwhile cannot mix two checkpoints.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from .._errors import CheckpointError, CheckpointNotFoundError, CheckpointPathError

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata

#: the DCP metadata file torch writes; a folder without it is no checkpoint
DCP_METADATA = ".metadata"
#: idist's description of the checkpoint (entries and their kinds, who saved it, the save's nonce)
MANIFEST = "idist.json"
#: the plain values and the state of stateful objects, pickled by rank 0
VALUES = "idist-values.pt"
PROBE = ".idist-probe"

#: every name a checkpoint folder may hold: DCP's metadata (and its temporary and per-rank
#: forms), DCP's data files, idist's manifest, values and probe
_CHECKPOINT_FILE = re.compile(
    r"(\.metadata|__\d+\.metadata)(\.tmp)?|__\d+_\d+\.distcp|"
    + "|".join(re.escape(n) for n in (MANIFEST, VALUES, PROBE))
)


def is_checkpoint_file(name: str) -> bool:
    """Whether ``name`` is a file a checkpoint holds (what a save may remove)."""
    return _CHECKPOINT_FILE.fullmatch(name) is not None


def check_probe(tmp: Path, nonce: str, mine: Path, lead: str) -> None:
    """``CheckpointPathError`` unless this rank sees the probe that rank 0 just wrote in ``tmp``.

    ``mine`` is the path this rank was given, ``lead`` the one rank 0 was given.
    """
    try:
        seen = (tmp / PROBE).read_bytes().decode(errors="replace")
    except OSError as exc:
        if str(mine) != lead:
            raise CheckpointPathError(
                f"this rank saves to {mine}, rank 0 to {lead}: every rank must pass the same path, on a "
                "filesystem shared by all nodes (rank 0 publishes the checkpoint, every rank writes its part in it)"
            ) from exc
        raise CheckpointPathError(
            f"cannot see {tmp}, which rank 0 created ({type(exc).__name__}: {exc}); every rank must see the "
            "same folder: save to a filesystem shared by all nodes"
        ) from exc
    if seen != nonce:
        raise CheckpointPathError(
            f"{tmp} here is not the folder rank 0 created (another copy of the path): every rank must see "
            "the same folder: save to a filesystem shared by all nodes"
        )


def write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` and flush it to the disk before returning."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def pinned(path: Path) -> Iterator[Path]:
    """A path that reaches the folder now at ``path`` for as long as the block runs.

    On Linux the folder is held open and read through ``/proc/self/fd``: a save that
    publishes meanwhile moves it away, and every read still sees this one (or fails, once
    its files are removed). Elsewhere, and where the folder cannot be opened, ``path``.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield path  # the checks say what is wrong with it
        return
    try:
        held = Path(f"/proc/self/fd/{fd}")
        yield held if held.is_dir() else path
    finally:
        os.close(fd)


def check_complete(path: Path, metadata: Metadata, shown: Path) -> None:
    """``CheckpointError`` unless every data file the metadata names holds the bytes it names there."""
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, size in sorted(needed.items()):
        try:
            held = (path / name).stat().st_size
        except OSError as exc:
            raise CheckpointError(f"the checkpoint at {shown} lacks {name} ({type(exc).__name__})") from exc
        if held < size:
            raise CheckpointError(
                f"the checkpoint at {shown} is incomplete: {name} holds {held} bytes, its metadata names {size}"
            )


def set_aside(path: Path) -> list[Path]:
    """Previous checkpoints that saves moved aside while publishing (``.NAME.idist-old-NONCE``)."""
    return sorted(path.parent.glob(f".{glob_escape(path.name)}.idist-old-*"))


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def check_readable(path: Path, shown: Path) -> None:
    """``CheckpointNotFoundError`` unless ``path`` (shown as ``shown``) is a checkpoint folder this rank can read."""
    if (path / DCP_METADATA).is_file():
        return
    if not path.exists():
        aside = [p for p in set_aside(shown) if (p / DCP_METADATA).is_file()]
        hint = (
            f"; a save was interrupted while publishing and left the previous checkpoint at "
            f"{max(aside, key=lambda p: p.stat().st_mtime)}: "
            f"rename it to {shown.name}"
            if aside
            else ""
        )
        raise CheckpointNotFoundError(f"no checkpoint at {shown}{hint}")
    raise CheckpointNotFoundError(
        f"{shown} is not a checkpoint folder (no {DCP_METADATA} in it); pass a folder written by save_checkpoint "
        "or torch.distributed.checkpoint.save"
    )
