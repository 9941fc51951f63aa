"""``load_checkpoint``: every check first, then DCP reads, then the state is applied.

Each step ends with ``settle`` (every rank raises if any rank failed): (1) every rank finds
the checkpoint, reads its metadata and plain values, checks that every data file holds
what the metadata names, and compares the keys and shapes with the state (``_compare``);
with ``strict`` any difference fails here, before any tensor is read; (2) DCP reads into
the state's tensors (``_targets.to_load``), as ``dcp.load`` does; (3) the optimizers,
stateful objects and the caller's plain values are updated.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader

from .._errors import CheckpointMismatchError
from . import _compare, _dcp, _files, _state, _targets
from ._compare import Skipped
from ._settle import Failure, settle

if TYPE_CHECKING:
    from .._context import DistContext

logger = logging.getLogger("idist.checkpoint")


class Loaded(dict[str, Any]):
    """The checkpoint's plain values by name; ``skipped`` lists what a ``strict=False`` load left out."""

    skipped: Skipped

    def __init__(self, values: Mapping[str, object], skipped: Skipped) -> None:
        super().__init__(values)
        self.skipped = skipped


def read_values(folder: Path) -> tuple[dict[str, object], dict[str, Mapping[str, object]]]:
    """The plain values and stateful states rank 0 pickled (none for a checkpoint DCP alone wrote)."""
    path = folder / _files.VALUES
    if not path.exists():
        return {}, {}
    blob = torch.load(io.BytesIO(path.read_bytes()), map_location="cpu", weights_only=False)
    return dict(blob["values"]), dict(blob["stateful"])


def load(ctx: DistContext, path: str | os.PathLike[str], state: Mapping[str, object], strict: bool = True) -> Loaded:
    """See ``DistContext.load_checkpoint``."""
    folder = Path(os.path.abspath(path))
    what = f"loading checkpoint {folder}"
    error: Failure = None
    try:
        _files.check_readable(folder)
        entries = _state.classify(state)
        metadata = FileSystemReader(folder).read_metadata()
        _files.check_complete(folder, metadata)
        values, stateful = read_values(folder)
        absent = [k for k in entries.values if k not in values] + [k for k in entries.stateful if k not in stateful]
        target = _targets.to_load(entries, metadata)
        module_of = {id(m): name for name, m in entries.modules.items()}
        owners = {name: module_of[id(owner)] for name, (_, owner) in entries.optimizers.items()}
        plan = _compare.compare(target, owners, metadata, absent)
        if strict and plan.skipped:
            raise CheckpointMismatchError(
                f"the state and the checkpoint differ ({plan.skipped.describe()}); fix the state, or pass "
                "strict=False to load what matches"
            )
        target = _compare.without(target, plan)
    except Exception as exc:
        error = exc
    settle(ctx, what, error)
    error = None
    try:
        _dcp.read(target, folder, metadata, ctx._dcp_group())
    except (Exception, CheckpointException) as exc:
        error = exc
    settle(ctx, what, error)
    error = None
    try:
        _targets.apply(entries, target, set(plan.partial))
        for name, obj in entries.stateful.items():
            if name in stateful:
                obj.load_state_dict(stateful[name])
    except Exception as exc:
        error = exc
    settle(ctx, what, error)
    if isinstance(state, MutableMapping):
        for name in entries.values:
            if name in values:
                state[name] = values[name]
    if plan.skipped:
        logger.warning("load_checkpoint(%s, strict=False) skipped %s", folder, plan.skipped.describe())
    return Loaded(values, plan.skipped)
