"""Comparing a state with a checkpoint's metadata before anything is read.

Keys are DCP's flattened names (``model.0.weight``, ``optim.state.0.weight.exp_avg``), so
they are the same whatever wrapper, world size or sharding saved them; a DTensor is
compared by its global shape.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import cast

import attrs
import torch
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from ._state import TensorState

#: names listed per kind of difference before the rest are counted
_SHOWN = 40


@attrs.frozen
class Skipped:
    """What a load left out: keys only the state has, keys only the checkpoint has, shapes that differ."""

    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    #: ``"key: checkpoint [a, b], state [c, d]"``
    mismatched: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.mismatched)

    def describe(self) -> str:
        parts = []
        for label, names in (("missing", self.missing), ("unexpected", self.unexpected), ("shape", self.mismatched)):
            if names:
                more = f" ... and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
                parts.append(f"{label} ({len(names)}): {', '.join(names[:_SHOWN])}{more}")
        return "; ".join(parts)


@attrs.frozen
class Plan:
    """What to read: the target without the skipped keys, and the entries read only in part."""

    skipped: Skipped
    #: flattened keys to drop from the target, with their path in the nested state
    drop: dict[str, tuple[str | int, ...]]
    #: optimizer entries to leave out whole (an optimizer is never loaded in part)
    drop_entries: frozenset[str]
    #: module entries loaded in part
    partial: frozenset[str]


def compare(target: dict[str, TensorState], owners: dict[str, str], metadata: Metadata, absent: list[str]) -> Plan:
    """The plan for loading ``target`` (entries by name) from a checkpoint with ``metadata``.

    ``owners`` maps each optimizer entry to the module entry holding its parameters: an
    optimizer is left out whole when any of its keys or of its module's is skipped.
    ``absent`` names plain values and stateful objects the checkpoint lacks.
    """
    stored = metadata.state_dict_metadata
    flat, mapping = flatten_state_dict(dict(target))
    missing = [k for k in flat if k not in stored]
    # entries the state does not name are left in the checkpoint (load a model without its optimizer)
    unexpected = [k for k in stored if k.split(".", 1)[0] in target and k not in flat]
    mismatched: list[str] = []
    for key, value in flat.items():
        meta = stored.get(key)
        if meta is None:
            continue
        if isinstance(value, torch.Tensor) != isinstance(meta, TensorStorageMetadata):
            where = "the state" if isinstance(meta, TensorStorageMetadata) else "the checkpoint"
            mismatched.append(f"{key}: not a tensor in {where}")
        elif isinstance(value, torch.Tensor) and isinstance(meta, TensorStorageMetadata):
            if tuple(value.shape) != tuple(meta.size):
                mismatched.append(f"{key}: checkpoint {list(meta.size)}, state {list(value.shape)}")
    bad = set(missing) | {m.split(":", 1)[0] for m in mismatched}
    touched = {k.split(".", 1)[0] for k in bad | set(unexpected)}
    drop_entries = frozenset(n for n, module in owners.items() if n in touched or module in touched)
    drop = {k: mapping[k] for k in bad if k.split(".", 1)[0] not in drop_entries}
    partial = frozenset(k.split(".", 1)[0] for k in drop) | frozenset(k.split(".", 1)[0] for k in unexpected)
    skipped = Skipped(tuple(missing + absent), tuple(unexpected), tuple(mismatched))
    return Plan(skipped, drop, drop_entries, partial - drop_entries)


def without(target: dict[str, TensorState], plan: Plan) -> dict[str, TensorState]:
    """``target`` with the plan's skipped keys and entries taken out (in place)."""
    for name in plan.drop_entries:
        target.pop(name, None)
    for path in plan.drop.values():
        # a module's state dict is flat under its entry; optimizers are never dropped in part
        node = cast("MutableMapping[object, object]", target)
        for step in path[:-1]:
            node = cast("MutableMapping[object, object]", node[step])
        del node[path[-1]]
    return target
