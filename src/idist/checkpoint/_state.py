"""What a checkpoint's ``state`` holds: the entries sorted by kind, and the pickled part.

Modules (plain, DDP- or FSDP-wrapped) and optimizers become DCP state (``_targets``); an
optimizer goes with the module whose parameters it updates. *Stateful* objects
(``state_dict()`` and ``load_state_dict()``: LR schedulers, GradScaler) and plain values
are pickled beside the DCP files by rank 0.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

import attrs
import torch
from torch import nn
from torch.optim import Optimizer

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
