"""``idist checkpoint info DIR`` and ``idist checkpoint convert DIR OUT.pt``: a checkpoint read in one process.

``info`` lists every entry with its kind, each tensor's key, dtype and global shape (from
the DCP metadata, without reading the tensors) and the plain values; it never runs a
checkpoint's code: a file it refuses is named, and the rest is still shown. ``convert``
reads the whole, unsharded state and writes it as one ``torch.save`` file for serving or
inspection; it refuses like a load unless told to trust the checkpoint (``--trust``).
"""

from __future__ import annotations

import os
import reprlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

# the reader torch's own dcp_to_torch_save uses: fills an empty dict with the whole state
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from .._errors import CheckpointError
from . import _dcp, _files, _manifest, _read
from ._settle import describe

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_INFO_WAY_OUT = "read it with load_checkpoint(path, state, weights_only=False) or idist checkpoint convert --trust"
_CONVERT_WAY_OUT = "pass --trust"
T = TypeVar("T")


def _size(nbytes: int) -> str:
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _attempt(fn: Callable[[], T], problems: list[str]) -> T | None:
    try:
        return fn()
    except CheckpointError as exc:
        problems.append(str(exc))
        return None


def _saved_by(manifest: dict[str, object]) -> str:
    saved = manifest.get("saved_by")
    if not isinstance(saved, dict):
        return "written by torch.distributed.checkpoint alone (no idist manifest)"
    shards = ", sharded (FSDP)" if saved.get("sharded") is True else ""
    by = f"{saved.get('backend')} on {saved.get('world_size')} rank(s)"
    return f"saved by {by}{shards}; torch {manifest.get('torch')}"


def _tensors(metadata: Metadata, kinds: dict[str, object]) -> list[str]:
    stored = metadata.state_dict_metadata
    entries: dict[str, list[str]] = {}
    for key in sorted(stored):
        entries.setdefault(key.split(".", 1)[0], []).append(key)
    lines = []
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
    return lines


def info(folder: Path) -> tuple[list[str], list[str]]:
    """The lines ``idist checkpoint info`` prints, and one line per file it refused or could not read."""
    problems: list[str] = []
    with _files.pinned(folder) as via:
        _files.check_readable(via, folder)
        manifest = _attempt(lambda: _manifest.read(via, folder), problems) or {}
        kinds = manifest.get("entries")
        lines = [f"checkpoint {folder}", _saved_by(manifest)]
        found = _attempt(lambda: _read.read_metadata(via, folder, False, _INFO_WAY_OUT), problems)
        if found is not None:
            lines += _tensors(found[0], kinds if isinstance(kinds, dict) else {})
        values = _attempt(lambda: _read.read_values(via, folder, False, _INFO_WAY_OUT), problems)
    for name, state in (values or ({}, {}))[1].items():
        lines.append(f"{name} (stateful): {_REPR.repr(state)}")
    for name, value in (values or ({}, {}))[0].items():
        lines.append(f"{name} (value, {type(value).__name__}): {_REPR.repr(value)}")
    return lines, problems


def convert(folder: Path, out: Path, trusted: bool = False) -> dict[str, object]:
    """Write the whole state (tensors unsharded, plain values, stateful states) to ``out`` with
    ``torch.save``, atomically; returns what was written. ``CheckpointUnsafeError`` for a file
    that names code to run, unless ``trusted``."""
    state: dict[str, object] = {}
    with _files.pinned(folder) as via:
        _files.check_readable(via, folder)
        _manifest.read(via, folder)
        metadata, _ = _read.read_metadata(via, folder, trusted, _CONVERT_WAY_OUT)
        values, stateful = _read.read_values(via, folder, trusted, _CONVERT_WAY_OUT)
        try:
            reader = _dcp.Reader(via, metadata)
            _load_state_dict(state, storage_reader=reader, planner=_dcp.whole_planner(trusted), no_dist=True)
        except (Exception, CheckpointException) as exc:
            refused = _read.unsafe_in(exc, folder, _CONVERT_WAY_OUT)
            if refused is not None:
                raise refused from None
            raise CheckpointError(describe(exc).replace(str(via), str(folder))) from exc
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
