"""What a checkpoint's ``state`` holds, and how each kind becomes DCP state and back.

Modules (plain, DDP- or FSDP-wrapped) and optimizers go through
``torch.distributed.checkpoint.state_dict``, whose keys do not depend on the wrapper, the
world size or the sharding. An optimizer is saved with the module whose parameters it
updates. *Stateful* objects (``state_dict()`` and ``load_state_dict()``: LR schedulers,
GradScaler) and plain values are pickled beside the DCP files by rank 0.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any, Literal, Protocol, TypeAlias, cast, runtime_checkable

import attrs
import torch
from torch import nn
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

from .._errors import CheckpointStateError

Kind: TypeAlias = Literal["module", "optimizer", "stateful", "value"]
#: one entry's DCP state: a module's or an optimizer's (nested) state dict, as torch's functions type it
TensorState: TypeAlias = dict[str, Any]


@runtime_checkable
class Stateful(Protocol):
    def state_dict(self) -> Mapping[str, object]: ...
    def load_state_dict(self, state_dict: Mapping[str, object], /) -> object: ...


@attrs.frozen
class Entries:
    """The ``state`` mapping sorted by kind (names kept)."""

    modules: dict[str, nn.Module]
    #: name -> (optimizer, the module in ``modules`` that holds its parameters)
    optimizers: dict[str, tuple[Optimizer, nn.Module]]
    stateful: dict[str, Stateful]
    values: dict[str, object]

    def kinds(self) -> dict[str, Kind]:
        out: dict[str, Kind] = {}
        out.update(dict.fromkeys(self.modules, "module"))
        out.update(dict.fromkeys(self.optimizers, "optimizer"))
        out.update(dict.fromkeys(self.stateful, "stateful"))
        out.update(dict.fromkeys(self.values, "value"))
        return out


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name or "." in name:
        raise CheckpointStateError(
            f"state keys must be non-empty str without '.', got {name!r} (DCP joins nested keys with '.')"
        )
    return name


def _owner(name: str, opt: Optimizer, modules: dict[str, nn.Module]) -> nn.Module:
    wanted = {id(p) for group in opt.param_groups for p in group["params"]}
    for module in modules.values():
        if wanted <= {id(p) for p in module.parameters()}:
            return module
    raise CheckpointStateError(
        f"optimizer {name!r} updates parameters of no single module in the state; put its model in the state "
        "(one nn.Module holding all of its parameters, e.g. an nn.ModuleDict of several models)"
    )


def classify(state: Mapping[str, object]) -> Entries:
    """Sort ``state`` by kind; ``CheckpointStateError`` for a name or an optimizer that cannot work."""
    if not isinstance(state, Mapping):
        raise CheckpointStateError(f"state must be a mapping of names to objects, got {type(state).__name__}")
    modules: dict[str, nn.Module] = {}
    optimizers: dict[str, Optimizer] = {}
    stateful: dict[str, Stateful] = {}
    values: dict[str, object] = {}
    for key, obj in state.items():
        name = _check_name(key)
        if isinstance(obj, nn.Module):
            modules[name] = obj
        elif isinstance(obj, Optimizer):
            optimizers[name] = obj
        elif not isinstance(obj, type) and isinstance(obj, Stateful):
            stateful[name] = obj
        else:
            values[name] = obj
    paired = {name: (opt, _owner(name, opt, modules)) for name, opt in optimizers.items()}
    return Entries(modules, paired, stateful, values)


def tensor_state(entries: Entries, *, keep_fresh: bool) -> dict[str, TensorState]:
    """Each module's and optimizer's DCP state dict (tensors alias the live ones).

    torch fills a fresh optimizer's state with a zero step first. For a save
    (``keep_fresh=False``) that is undone and the optimizer is saved without state, so a
    checkpoint taken before the first step resumes exactly like a fresh optimizer.
    """
    out: dict[str, TensorState] = {name: dict(get_model_state_dict(m)) for name, m in entries.modules.items()}
    for name, (opt, owner) in entries.optimizers.items():
        fresh = not opt.state
        osd: TensorState = dict(get_optimizer_state_dict(owner, opt))
        if fresh and not keep_fresh:
            opt.state.clear()
            osd["state"] = {}
        out[name] = osd
    return out


def has_shards(state: Mapping[str, object]) -> bool:
    found = False

    def see(t: torch.Tensor) -> torch.Tensor:
        nonlocal found
        found = found or isinstance(t, DTensor)
        return t

    tree_map_only(torch.Tensor, see, dict(state))
    return found


def _host_only(t: torch.Tensor) -> bool:
    """Devices torch.distributed.checkpoint cannot write from or read into (XLA): staged on the CPU."""
    return not isinstance(t, DTensor) and t.device.type not in ("cpu", "cuda", "meta")


def for_writing(state: dict[str, TensorState]) -> dict[str, TensorState]:
    """``state`` with tensors on devices DCP cannot write from copied to the CPU."""
    return cast("dict[str, TensorState]", tree_map_only(torch.Tensor, lambda t: t.cpu() if _host_only(t) else t, state))


def scratch(state: dict[str, TensorState]) -> dict[str, TensorState]:
    """``state`` with every tensor replaced by an uninitialized one of its shape (DTensor: same sharding).

    A load reads into these, so nothing live changes until every rank has read everything.
    """

    def empty(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t, device="cpu") if _host_only(t) else torch.empty_like(t)

    return cast("dict[str, TensorState]", tree_map_only(torch.Tensor, empty, state))


def apply(entries: Entries, loaded: Mapping[str, TensorState], partial: set[str]) -> None:
    """Copy what was read into the modules and optimizers; ``partial`` names modules loaded in part."""
    for name, module in entries.modules.items():
        if name in loaded:
            options = StateDictOptions(strict=name not in partial)
            set_model_state_dict(module, dict(loaded[name]), options=options)
    for name, (opt, owner) in entries.optimizers.items():
        if name in loaded:
            osd = dict(loaded[name])
            set_optimizer_state_dict(owner, opt, osd)
            if not osd.get("state"):
                opt.state.clear()  # saved before its first step: fresh again


def pickled(entries: Entries) -> bytes:
    """The plain values and stateful objects' states, as rank 0 writes them."""
    blob = {"values": entries.values, "stateful": {k: v.state_dict() for k, v in entries.stateful.items()}}
    buf = io.BytesIO()
    try:
        torch.save(blob, buf)
    except Exception as exc:
        candidates = {**entries.values, **{k: v.state_dict() for k, v in entries.stateful.items()}}
        bad = next((k for k, v in candidates.items() if not _picklable(v)), None)
        raise CheckpointStateError(
            f"state[{bad!r}] cannot be pickled ({type(exc).__name__}: {exc}); save a picklable value "
            "(or an object with state_dict() and load_state_dict())"
        ) from exc
    return buf.getvalue()


def _picklable(value: object) -> bool:
    try:
        torch.save(value, io.BytesIO())
    except Exception:
        return False
    return True
