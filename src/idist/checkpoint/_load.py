"""``load_checkpoint``: every check first, then the stateful objects, then DCP reads, then the rest.

Each step ends with ``settle`` (every rank raises if any rank failed). (1) Every rank holds
the folder open (``_files.pinned``), reads the manifest, DCP's metadata and the plain values
(through ``_unpickle`` unless ``weights_only=False``) and compares keys and shapes
(``_compare``); rank 0 alone checks the data files' sizes (O(files) stats in all, not per
rank); the settle shares that and compares the save each rank read.
(2) A rank reading a copy of the save at another path checks its data files, then stateful
objects load (put back on every rank if one fails). (3) DCP reads into the
state's tensors. (4) Optimizers take their state, then plain values are returned. A failure
in (3) or (4) puts the stateful objects back and says which tensors it may have changed.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.distributed.checkpoint.api import CheckpointException

from .. import _reports
from .._errors import CheckpointError, CheckpointMismatchError
from . import _compare, _dcp, _files, _state, _targets
from ._compare import Skipped
from ._read import check, unsafe_in
from ._settle import Failure, describe, settle

if TYPE_CHECKING:
    from .._context import DistContext

logger = logging.getLogger("idist.checkpoint")

_SEP = "\x1f"
#: saves named in a mismatch before the rest are counted
_SHOWN = 8
#: characters of a rank's path it sends for the mismatch message (the end of it)
_PATH = 200
_STATEFUL_BACK = "; nothing was changed (stateful objects that had loaded were put back)"
_TENSORS = (
    "; the modules' parameters and buffers and the optimizers' state may hold part of the checkpoint "
    "(DCP reads into them in place), the stateful objects and plain values are as they were: load again"
)


class Loaded(dict[str, Any]):
    """The checkpoint's plain values by name; ``skipped`` lists what a ``strict=False`` load left out."""

    skipped: Skipped

    def __init__(self, values: Mapping[str, object], skipped: Skipped) -> None:
        super().__init__(values)
        self.skipped = skipped


def load(
    ctx: DistContext, path: str | os.PathLike[str], state: Mapping[str, object], strict: bool, weights_only: bool
) -> Loaded:
    """See ``DistContext.load_checkpoint``."""
    folder = Path(os.path.abspath(path))
    with _files.pinned(folder) as via:
        return _load(ctx, folder, via, state, strict, not weights_only)


def _local(exc: Exception | CheckpointException, folder: Path, via: Path) -> Exception:
    """This rank's failure as the error every rank raises: refusals named, paths as the user wrote them."""
    refused = unsafe_in(exc, folder)
    if refused is not None:
        return refused
    if isinstance(exc, CheckpointError):
        return exc
    return CheckpointError(describe(exc).replace(str(via), str(folder)))


def _load(
    ctx: DistContext, folder: Path, via: Path, state: Mapping[str, object], strict: bool, trusted: bool
) -> Loaded:
    what = f"loading checkpoint {folder}"
    error: Failure = None
    token = ""
    try:
        found = check(via, folder, state, trusted, files=ctx.rank == 0)
        if strict and found.plan.skipped:
            raise CheckpointMismatchError(
                f"the state and the checkpoint differ ({found.plan.skipped.describe()}); fix the state, or pass "
                "strict=False to load what matches"
            )
        shown = str(folder) if len(str(folder)) <= _PATH else "..." + str(folder)[-_PATH:]  # O(1) bytes a rank
        path = hashlib.blake2b(str(folder).encode(errors="surrogateescape"), digest_size=8).hexdigest()
        token = _SEP.join((found.token, "1" if found.entries.stateful else "", path, shown))
    except Exception as exc:
        error = _local(exc, folder, via)
    tokens = settle(ctx, what, error, token)
    _same_save(what, tokens)
    entries, target = found.entries, _compare.without(found.target, found.plan)
    snapshots: dict[str, Mapping[str, object]] = {}
    # rank 0 checked the data files of its folder; a rank that reads a copy elsewhere checks its own
    copies = [t.split(_SEP)[2] != tokens[0].split(_SEP)[2] for t in tokens]
    if any(t.split(_SEP)[1] for t in tokens) or any(copies):
        error = None
        try:
            if copies[ctx.rank]:
                _files.check_complete(via, found.metadata, folder)
            for name, obj in entries.stateful.items():
                if name in found.stateful:
                    snapshots[name] = _snapshot(obj)
                    obj.load_state_dict(found.stateful[name])
        except Exception as exc:
            error = exc
        _step(ctx, what, error, entries, snapshots, _STATEFUL_BACK)
    error = None
    try:
        _dcp.read(target, via, found.metadata, ctx._dcp_group(), trusted)
    except (Exception, CheckpointException) as exc:
        error = _local(exc, folder, via)
    _step(ctx, what, error, entries, snapshots, _TENSORS)
    error = None
    try:
        _targets.apply(entries, target, set(found.plan.partial))
    except Exception as exc:
        error = exc
    _step(ctx, what, error, entries, snapshots, _TENSORS)
    if isinstance(state, MutableMapping):
        for name in entries.values:
            if name in found.values:
                state[name] = found.values[name]
    if found.plan.skipped:
        logger.warning("load_checkpoint(%s, strict=False) skipped %s", folder, found.plan.skipped.describe())
    return Loaded(found.values, found.plan.skipped)


def _snapshot(obj: _state.Stateful) -> Mapping[str, object]:
    """What puts ``obj`` back: a deep copy of its state dict (the dict itself where it cannot be copied)."""
    state = obj.state_dict()
    try:
        return copy.deepcopy(state)
    except Exception:
        return state  # load_state_dict usually rebinds what it loads, so the dict it gave still holds the old state


def _step(
    ctx: DistContext,
    what: str,
    error: Failure,
    entries: _state.Entries,
    snapshots: dict[str, Mapping[str, object]],
    changed: str,
) -> None:
    """Settle a step that changes the state: on failure, put the stateful objects back, then raise."""
    try:
        settle(ctx, what, error, changed=changed)
    except CheckpointError as exc:
        for name, saved in snapshots.items():
            try:
                entries.stateful[name].load_state_dict(saved)
            except Exception as again:
                raise type(exc)(f"{exc}; putting {name!r} back failed too ({_reports.cut(describe(again))})") from again
        raise


def _same_save(what: str, tokens: list[str]) -> None:
    """``CheckpointMismatchError`` on every rank unless every rank read the same save (all have ``tokens``)."""
    saves: dict[str, list[int]] = {}
    for rank, token in enumerate(tokens):
        saves.setdefault(token.split(_SEP)[0], []).append(rank)
    if len(saves) == 1:
        return
    parts = []
    for nonce, ranks in list(saves.items())[:_SHOWN]:
        parts.append(f"{_reports.ranks(ranks)} read save {nonce[:12]} at {tokens[ranks[0]].split(_SEP)[3]}")
    more = f"; and {len(saves) - _SHOWN} more saves" if len(saves) > _SHOWN else ""
    raise CheckpointMismatchError(
        f"{what} failed: the ranks read different checkpoints ({'; '.join(parts)}{more}); every rank must "
        "load the same one (if a save published while the ranks read, load again); nothing was changed"
    )
