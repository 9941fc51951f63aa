"""Modules and optimizers as DCP state: what a save writes, what a load reads into, and applying it.

Keys come from ``torch.distributed.checkpoint.state_dict``, so they do not depend on the
wrapper (DDP, FSDP), the world size or the sharding. An optimizer is never stepped to
learn its state's shapes (torch's own way, which runs Horovod's collectives and its
``zero_grad``): state it does not hold yet is read into new tensors shaped as the
checkpoint says, sharded like their parameter where the shapes agree.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import cast

import torch
from torch import nn
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer
from torch.utils._pytree import tree_map_only

from ._state import Entries, TensorState

#: what an empty optimizer state holds while torch converts it (so torch does not step it)
_PLACEHOLDER = "idist-placeholder"


def _host_only(t: torch.Tensor) -> bool:
    """Devices torch.distributed.checkpoint cannot write from or read into (XLA): staged on the CPU."""
    return not isinstance(t, DTensor) and t.device.type not in ("cpu", "cuda", "meta")


@contextmanager
def _unstepped(opt: Optimizer) -> Iterator[None]:
    """torch steps an optimizer with an empty state (zero gradients, lr 0) before converting
    it; a placeholder entry makes the state look filled, and is gone afterwards."""
    fresh = not opt.state
    if fresh:
        first = next(p for group in opt.param_groups for p in group["params"])
        opt.state[first] = {_PLACEHOLDER: 0}
    try:
        yield
    finally:
        if fresh and any(_PLACEHOLDER in s for s in opt.state.values()):
            opt.state.clear()


def _optimizer(owner: nn.Module, opt: Optimizer) -> tuple[TensorState, dict[str, torch.Tensor]]:
    """The optimizer's DCP state dict (state empty when it has none) and its parameters by key."""
    fresh = not opt.state
    with _unstepped(opt):
        osd: TensorState = dict(get_optimizer_state_dict(owner, opt))
    if fresh:
        osd["state"] = {}
    keys = [key for group in osd["param_groups"] for key in group["params"]]
    params = [p for group in opt.param_groups for p in group["params"]]
    return osd, dict(zip(keys, params, strict=True))


def saved(entries: Entries) -> dict[str, TensorState]:
    """What a save writes: each module's and optimizer's state dict (aliasing the live tensors)."""
    out: dict[str, TensorState] = {name: dict(get_model_state_dict(m)) for name, m in entries.modules.items()}
    for name, (opt, owner) in entries.optimizers.items():
        out[name] = _optimizer(owner, opt)[0]
    return cast("dict[str, TensorState]", tree_map_only(torch.Tensor, lambda t: t.cpu() if _host_only(t) else t, out))


def _empty(like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    if _host_only(like):
        return torch.empty(like.shape, dtype=dtype or like.dtype, device="cpu")
    return torch.empty_like(like, dtype=dtype or like.dtype)


def _optimizer_state(
    name: str, params: dict[str, torch.Tensor], live: Mapping[str, Mapping[str, object]], stored: Mapping[str, object]
) -> dict[str, object]:
    """Optimizer state to read into, for each key the checkpoint holds for a parameter of ours
    (``NAME.state.<parameter key>.<field>``; a parameter key has dots, a field has none): the
    live tensor where it has the saved shape and dtype, else a new one (sharded as its
    parameter where the shapes agree). Live state the checkpoint lacks is left out: loading
    replaces the optimizer's state, as ``Optimizer.load_state_dict`` does."""
    state: dict[str, dict[str, object]] = {}
    prefix = f"{name}.state."
    for full, meta in stored.items():
        if not full.startswith(prefix):
            continue
        key, _, field = full[len(prefix) :].rpartition(".")
        if key not in params:
            continue  # state of a parameter this optimizer does not have: reported as unexpected
        param, current = params[key], live.get(key, {}).get(field)
        if not isinstance(meta, TensorStorageMetadata):
            value: object = 0
        elif _fits(current, meta):
            value = current
        elif tuple(meta.size) == tuple(param.shape):
            value = _empty(param.detach(), meta.properties.dtype)
        else:
            value = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        state.setdefault(key, {})[field] = value
    return dict(state)


def _fits(t: object, meta: TensorStorageMetadata) -> bool:
    """Whether DCP can read ``meta``'s tensor straight into ``t``."""
    return (
        isinstance(t, torch.Tensor)
        and not _host_only(t)
        and tuple(t.shape) == tuple(meta.size)
        and t.dtype == meta.properties.dtype
    )


def to_load(entries: Entries, metadata: Metadata) -> dict[str, TensorState]:
    """What a load reads into: the live tensors, as ``dcp.load`` does (new CPU ones for devices
    DCP cannot read into, and for optimizer state the optimizer does not hold yet)."""
    out: dict[str, TensorState] = {
        name: tree_map_only(torch.Tensor, lambda t: _empty(t) if _host_only(t) else t, dict(get_model_state_dict(m)))
        for name, m in entries.modules.items()
    }
    stored = metadata.state_dict_metadata
    for name, (opt, owner) in entries.optimizers.items():
        osd, params = _optimizer(owner, opt)
        osd["state"] = _optimizer_state(name, params, osd["state"], stored)
        osd["param_groups"] = [_group(name, i, group, stored) for i, group in enumerate(osd["param_groups"])]
        out[name] = osd
    return out


def _group(name: str, index: int, live: dict[str, object], stored: Mapping[str, object]) -> dict[str, object]:
    """A parameter group to read into: its parameters, and whatever settings the checkpoint has for it.

    The saved settings replace the live ones whole (as ``Optimizer.load_state_dict`` does), so
    a setting only one side has (a scheduler's ``initial_lr``, a newer torch's flag) is no mismatch.
    """
    prefix = f"{name}.param_groups.{index}."
    fields = {k[len(prefix) :] for k in stored if k.startswith(prefix)} - {"params"}
    return {"params": live["params"], **dict.fromkeys(fields, 0)}


def has_shards(state: Mapping[str, object]) -> bool:
    found = False

    def see(t: torch.Tensor) -> torch.Tensor:
        nonlocal found
        found = found or isinstance(t, DTensor)
        return t

    tree_map_only(torch.Tensor, see, dict(state))
    return found


def apply(entries: Entries, loaded: Mapping[str, TensorState], partial: set[str]) -> None:
    """Copy what was read into the modules and optimizers; ``partial`` names modules loaded in part."""
    for name, module in entries.modules.items():
        if name in loaded:
            options = StateDictOptions(strict=name not in partial)
            set_model_state_dict(module, dict(loaded[name]), options=options)
    for name, (opt, owner) in entries.optimizers.items():
        if name in loaded:
            with _unstepped(opt):  # load_state_dict replaces the whole state, placeholder included
                set_optimizer_state_dict(owner, opt, dict(loaded[name]))
