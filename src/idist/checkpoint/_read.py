"""What a load reads before it changes anything: the manifest, DCP's metadata, the plain values, the plan.

Shared by ``load_checkpoint`` (on every rank) and ``idist checkpoint info|convert``. Pickled
files go through ``_unpickle`` unless the caller trusts the checkpoint; a refused global
becomes ``CheckpointUnsafeError`` naming the file, the global and the way out.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path

import attrs
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata

from .._errors import CheckpointError, CheckpointUnsafeError
from . import _compare, _dcp, _files, _manifest, _state, _targets, _unpickle

#: the way out a refusal names, for a load
WAY_OUT = "load it with load_checkpoint(path, state, weights_only=False)"


@attrs.frozen
class Found:
    """What the first step of a load read and planned."""

    entries: _state.Entries
    metadata: Metadata
    values: dict[str, object]
    stateful: dict[str, Mapping[str, object]]
    #: what DCP reads into (the state's own tensors), before the plan drops the skipped keys
    target: dict[str, _state.TensorState]
    plan: _compare.Plan
    #: the save this rank read (``_manifest.token``)
    token: str


def _damaged(file: Path, exc: Exception) -> CheckpointError:
    return CheckpointError(f"{file} cannot be read ({type(exc).__name__}: {exc}): the checkpoint is damaged")


def read_metadata(via: Path, shown: Path, trusted: bool, way_out: str = WAY_OUT) -> tuple[Metadata, bytes]:
    """DCP's metadata (and its bytes) from the folder read through ``via`` and shown as ``shown``."""
    try:
        return _dcp.read_metadata(via, trusted=trusted)
    except _unpickle.Refused as exc:
        raise _unpickle.refusal(exc, shown / _files.DCP_METADATA, way_out) from None
    except CheckpointError:
        raise
    except (OSError, ValueError, TypeError, AttributeError, EOFError, ImportError, IndexError) as exc:
        raise _damaged(shown / _files.DCP_METADATA, exc) from exc
    except pickle.UnpicklingError as exc:
        raise _damaged(shown / _files.DCP_METADATA, exc) from exc


def read_values(
    via: Path, shown: Path, trusted: bool, way_out: str = WAY_OUT
) -> tuple[dict[str, object], dict[str, Mapping[str, object]]]:
    """The plain values and stateful states rank 0 pickled (none for a checkpoint DCP alone wrote)."""
    try:
        data = (via / _files.VALUES).read_bytes()
    except FileNotFoundError:
        return {}, {}
    file = shown / _files.VALUES
    try:
        blob = _unpickle.load_values(data, trusted=trusted)
    except _unpickle.Refused as exc:
        raise _unpickle.refusal(exc, file, way_out) from None
    except (OSError, ValueError, TypeError, AttributeError, EOFError, ImportError, RuntimeError) as exc:
        raise _damaged(file, exc) from exc
    except pickle.UnpicklingError as exc:
        raise _damaged(file, exc) from exc
    if not (isinstance(blob, dict) and isinstance(blob.get("values"), dict) and isinstance(blob.get("stateful"), dict)):
        raise CheckpointError(f"{file} does not hold idist's values and states: the checkpoint is damaged")
    return dict(blob["values"]), dict(blob["stateful"])


def check(via: Path, shown: Path, state: Mapping[str, object], trusted: bool, files: bool = True) -> Found:
    """Read everything a load needs except the tensors, and compare it with ``state``; with ``files``,
    also check that the data files hold what the metadata names (one stat a file)."""
    _files.check_readable(via, shown)
    entries = _state.classify(state)
    manifest = _manifest.read(via, shown)
    metadata, raw = read_metadata(via, shown, trusted)
    if files:
        _files.check_complete(via, metadata, shown)
    values, stateful = read_values(via, shown, trusted)
    absent = [k for k in entries.values if k not in values] + [k for k in entries.stateful if k not in stateful]
    target = _targets.to_load(entries, metadata)
    module_of = {id(m): name for name, m in entries.modules.items()}
    owners = {name: module_of[id(owner)] for name, (_, owner) in entries.optimizers.items()}
    plan = _compare.compare(target, owners, metadata, absent)
    return Found(entries, metadata, values, stateful, target, plan, _manifest.token(manifest, raw))


def unsafe_in(exc: BaseException, folder: Path | None = None, way_out: str = WAY_OUT) -> CheckpointUnsafeError | None:
    """A refusal inside ``exc`` (also one DCP wrapped on some rank), as the error to raise."""
    if isinstance(exc, CheckpointUnsafeError):
        return exc
    found = [exc] if isinstance(exc, _unpickle.Refused) else []
    if isinstance(exc, CheckpointException):
        found = [e for e, _trace in exc.failures.values() if isinstance(e, _unpickle.Refused)]
    if not found:
        return None
    where = found[0].source or "a data file"
    return _unpickle.refusal(found[0], where if folder is None else f"{folder / where}", way_out)
