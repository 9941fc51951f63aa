"""``save_checkpoint``: every rank writes its part into a staging folder; one rename publishes it.

Each step ends with ``settle`` (every rank raises if any rank failed): (1) prepare: sort the
state, take its DCP state and pickle its plain values; rank 0 checks what is at the path
(``_replaceable``: only a checkpoint is ever replaced) and stages the save under its nonce
(``_publish.stage``: lock, folder, probe); (2) every rank reads the probe, so a folder not
every rank sees is found before any data is written; (3) write (``_dcp``), and rank 0 adds
the plain values and the manifest; (4) rank 0 publishes (``_publish.publish``).
"""

from __future__ import annotations

import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from torch.distributed.checkpoint.api import CheckpointException

from .._errors import CheckpointStateError
from . import _dcp, _files, _manifest, _publish, _replaceable, _state, _targets
from ._settle import Failure, settle

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .._context import DistContext


def save(ctx: DistContext, path: str | os.PathLike[str], state: Mapping[str, object]) -> None:
    """See ``DistContext.save_checkpoint``."""
    target = Path(os.path.abspath(path))
    what = f"saving checkpoint {target}"
    lead = ctx.rank == 0
    _publish.wait_removals()  # at most one removal of replaced checkpoints at a time, per process
    # the others pass a placeholder of the same type: a str
    said = ctx.broadcast(f"{secrets.token_hex(16)}\n{target}" if lead else "", 0)
    nonce, _, lead_path = said.partition("\n")
    group = ctx._dcp_group()
    tmp = _publish.staged_folder(target, nonce)
    staging: _publish.Staging | None = None
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
            _replaceable.check(target)
            staging = _publish.stage(target, nonce)
    except Exception as exc:
        error = exc
    try:
        settle(ctx, what, error)
        _step(ctx, f"{what}: the staging folder", lambda: _files.check_probe(tmp, nonce, target, lead_path))

        def beside() -> None:
            if lead:
                _files.write_synced(tmp / _files.VALUES, values)
                _files.write_synced(tmp / _files.MANIFEST, _manifest.write(ctx, entries, sharded, nonce))

        def write() -> None:
            with ThreadPoolExecutor(1) as pool:  # rank 0's small files reach the disk while DCP writes
                done = pool.submit(beside)
                _dcp.write(tensors, tmp, group, lead)
                done.result()

        _step(ctx, what, write)
        _step(ctx, f"{what}: publishing", lambda: _publish.publish(staging) if staging is not None else None)
    except BaseException:
        if staging is not None and not staging.published:
            _publish.discard(staging)
        raise


def _step(ctx: DistContext, what: str, fn: Callable[[], object]) -> None:
    """Run ``fn`` here, then settle: every rank raises if it failed on any rank."""
    error: Failure = None
    try:
        fn()
    except (Exception, CheckpointException) as exc:
        error = exc
    settle(ctx, what, error)
