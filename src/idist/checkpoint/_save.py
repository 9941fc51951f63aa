"""``save_checkpoint``: every rank writes its part into a staging folder; one rename publishes it.

Each step ends with ``settle`` (every rank raises if any rank failed): (1) prepare: sort the
state, take its DCP state and pickle its plain values; rank 0 makes the staging folder
(removing a stale one) with a probe holding a nonce; (2) every rank reads the probe, so a
folder not every rank sees is found before any data is written; (3) write (``_dcp``), and
rank 0 adds the plain values and the manifest; (4) rank 0 publishes (``_files.publish``).
"""

from __future__ import annotations

import json
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.distributed.checkpoint.api import CheckpointException

from .._errors import CheckpointStateError
from . import _dcp, _files, _state, _targets
from ._settle import Failure, settle

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._context import DistContext

FORMAT = "idist-checkpoint"
VERSION = 1


def manifest(ctx: DistContext, entries: _state.Entries, sharded: bool) -> bytes:
    """What ``idist checkpoint info`` and a load read first: the entries, their kinds, who saved them."""
    return json.dumps(
        {
            "format": FORMAT,
            "version": VERSION,
            "entries": entries.kinds(),
            "saved_by": {"backend": ctx.backend, "world_size": ctx.world_size, "sharded": sharded},
            "torch": torch.__version__,
        },
        indent=1,
    ).encode()


def save(ctx: DistContext, path: str | os.PathLike[str], state: Mapping[str, object]) -> None:
    """See ``DistContext.save_checkpoint``."""
    target = Path(os.path.abspath(path))
    what = f"saving checkpoint {target}"
    lead = ctx.rank == 0
    _files.wait_removals()  # a replaced checkpoint of an earlier save may still hold the staging name
    nonce = ctx.broadcast(secrets.token_hex(16) if lead else "", 0)  # the others pass a placeholder: a str
    group = ctx._dcp_group()
    tmp = _files.staging(target)
    error: Failure = None
    try:
        entries = _state.classify(state)
        tensors = _targets.saved(entries)
        sharded = _targets.has_shards(tensors)
        if sharded and group is None:
            raise CheckpointStateError(
                f"the state holds sharded tensors (FSDP) but this {type(ctx).__name__} has no torch process group "
                "to save them over; create the context with idist.initialize / idist.context"
            )
        values = _state.pickled(entries)  # on every rank: a value pickle refuses fails the save anywhere
        if lead:
            _files.fresh_staging(target, nonce)
    except Exception as exc:
        error = exc
    try:
        settle(ctx, what, error)
        _step(ctx, f"{what}: the staging folder", lambda: _files.check_probe(tmp, nonce))

        def beside() -> None:
            if lead:
                _files.write_synced(tmp / _files.VALUES, values)
                _files.write_synced(tmp / _files.MANIFEST, manifest(ctx, entries, sharded))

        def write() -> None:
            with ThreadPoolExecutor(1) as pool:  # rank 0's small files reach the disk while DCP writes
                done = pool.submit(beside)
                _dcp.write(tensors, tmp, group, lead)
                done.result()

        _step(ctx, what, write)
        _step(ctx, f"{what}: publishing", lambda: _files.publish(tmp, target) if lead else None)
    except BaseException:
        if lead:
            _discard(tmp)
        raise


def _step(ctx: DistContext, what: str, fn: Callable[[], object]) -> None:
    """Run ``fn`` here, then settle: every rank raises if it failed on any rank."""
    error: Failure = None
    try:
        fn()
    except (Exception, CheckpointException) as exc:
        error = exc
    settle(ctx, what, error)


def _discard(tmp: Path) -> None:
    """Remove a failed save's staging folder (the next save removes it otherwise)."""
    try:
        _files.remove(tmp)
    except OSError:
        pass
