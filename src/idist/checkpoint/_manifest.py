"""``idist.json``: what a checkpoint holds, who saved it, and the save's nonce (plain JSON, never pickled).

A load reads it first: an unknown ``format`` or a newer ``version`` is refused, and the
nonce tells whether every rank read the same save. A folder DCP alone wrote has none; its
``.metadata``'s digest stands in for the nonce.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .._errors import CheckpointError
from . import _files

if TYPE_CHECKING:
    from .._context import DistContext
    from ._state import Entries

FORMAT = "idist-checkpoint"
#: the newest manifest this idist reads (and the one it writes)
VERSION = 1


def write(ctx: DistContext, entries: Entries, sharded: bool, nonce: str) -> bytes:
    """What ``idist checkpoint info`` and a load read first: the entries, their kinds, who saved them."""
    return json.dumps(
        {
            "format": FORMAT,
            "version": VERSION,
            "nonce": nonce,
            "entries": entries.kinds(),
            "saved_by": {"backend": ctx.backend, "world_size": ctx.world_size, "sharded": sharded},
            "torch": torch.__version__,
        },
        indent=1,
    ).encode()


def read(folder: Path, shown: Path) -> dict[str, object]:
    """The manifest in ``folder`` (empty for a folder DCP alone wrote); ``CheckpointError`` for one
    this idist cannot read."""
    path = folder / _files.MANIFEST
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return {}
    where = shown / _files.MANIFEST
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise CheckpointError(f"{where} is not valid JSON ({exc}): the checkpoint is damaged") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise CheckpointError(
            f"{where} is not an idist checkpoint manifest (format {found!r}, expected {FORMAT!r}); "
            f"remove it to load the folder as a plain torch.distributed.checkpoint"
        )
    version = manifest.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CheckpointError(f"{where} has no valid version ({version!r}): the checkpoint is damaged")
    if version > VERSION:
        raise CheckpointError(
            f"{where} was written by a newer idist (manifest version {version}; this idist reads up to "
            f"{VERSION}): upgrade idist to load it"
        )
    return manifest


def token(manifest: dict[str, object], metadata: bytes) -> str:
    """What identifies the save a rank read: its nonce, else the digest of DCP's metadata."""
    nonce = manifest.get("nonce")
    if isinstance(nonce, str) and nonce:
        return nonce[:64]
    return "dcp-" + hashlib.blake2b(metadata, digest_size=16).hexdigest()
