"""``idist checkpoint info DIR`` and ``idist checkpoint convert DIR OUT.pt``: a checkpoint read in one process.

``info`` lists every entry with its kind, each tensor's key, dtype and global shape (from
the DCP metadata, without reading the tensors) and the plain values. ``convert`` reads the
whole, unsharded state and writes it as one ``torch.save`` file (``{"model": state_dict,
"optim": ..., "epoch": ...}``) for serving or inspection; it needs memory for all of it.
"""

from __future__ import annotations

import json
import os
import reprlib
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlanner

# the reader torch's own dcp_to_torch_save uses: fills an empty dict with the whole state
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from . import _files
from ._load import read_values

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
#: torch leaves its __init__ unannotated; this is the planner dcp_to_torch_save reads with
_WHOLE: Callable[[], LoadPlanner] = _EmptyStateDictLoadPlanner


def _size(nbytes: int) -> str:
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def info(folder: Path) -> list[str]:
    """The lines ``idist checkpoint info`` prints."""
    _files.check_readable(folder)
    manifest_path = folder / _files.MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    kinds: dict[str, str] = manifest.get("entries", {})
    lines = [f"checkpoint {folder}"]
    saved = manifest.get("saved_by")
    if saved:
        shards = ", sharded (FSDP)" if saved["sharded"] else ""
        lines.append(f"saved by {saved['backend']} on {saved['world_size']} rank(s){shards}; torch {manifest['torch']}")
    else:
        lines.append("written by torch.distributed.checkpoint alone (no idist manifest)")
    stored = FileSystemReader(folder).read_metadata().state_dict_metadata
    entries: dict[str, list[str]] = {}
    for key in sorted(stored):
        entries.setdefault(key.split(".", 1)[0], []).append(key)
    for name, keys in entries.items():
        tensors = [stored[k] for k in keys if isinstance(stored[k], TensorStorageMetadata)]
        numel = sum(m.size.numel() for m in tensors if isinstance(m, TensorStorageMetadata))
        lines.append(f"{name} ({kinds.get(name, 'tensors')}): {len(tensors)} tensors, {numel:,} elements")
        for key in keys:
            meta = stored[key]
            sub = key[len(name) + 1 :]
            if isinstance(meta, TensorStorageMetadata):
                dtype = str(meta.properties.dtype).removeprefix("torch.")
                nbytes = meta.size.numel() * meta.properties.dtype.itemsize
                lines.append(f"  {sub}  {dtype}  {list(meta.size)}  {_size(nbytes)}")
            else:
                lines.append(f"  {sub}  (value)")
    values, stateful = read_values(folder)
    for name, state in stateful.items():
        lines.append(f"{name} (stateful): {_REPR.repr(dict(state))}")
    for name, value in values.items():
        lines.append(f"{name} (value, {type(value).__name__}): {_REPR.repr(value)}")
    return lines


def convert(folder: Path, out: Path) -> dict[str, object]:
    """Write the whole state (tensors unsharded, plain values, stateful states) to ``out`` with
    ``torch.save``, atomically; returns what was written."""
    _files.check_readable(folder)
    state: dict[str, object] = {}
    _load_state_dict(state, storage_reader=FileSystemReader(folder), planner=_WHOLE(), no_dist=True)
    values, stateful = read_values(folder)
    state.update(stateful)
    state.update(values)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    return state
