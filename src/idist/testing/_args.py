"""Each rank's own copy of a run's arguments, as each process would unpickle its own.

``copy.deepcopy`` once per rank, with one shortcut: a plain tensor among the arguments (a
contiguous leaf without ``.grad`` or attributes, the only user of its storage there) is
cloned, which is what deepcopy makes of it (less the storage outside it) at a seventh of the cost. A property that
hands every rank all the ranks' inputs copies N² tensors per run.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence

import torch

from .._errors import UnsupportedValueError


def per_rank(args: tuple[object, ...], world_size: int, share: bool) -> list[tuple[object, ...]]:
    """``world_size`` copies of ``args`` (the same tuple each time when ``share``)."""
    if share:
        return [args] * world_size
    plain = _plain_tensors(args)
    try:
        return [copy.deepcopy(args, {id(t): _clone(t) for t in plain}) for _ in range(world_size)]
    except Exception as exc:
        raise UnsupportedValueError(
            f"the arguments cannot be copied for each rank ({type(exc).__name__}: {exc}); create that object "
            "inside the function, or pass share_args=True to give every rank the same objects (docs/testing.md)"
        ) from exc


def _clone(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(t.requires_grad)


def _plain_tensors(args: tuple[object, ...]) -> list[torch.Tensor]:
    """The tensors inside ``args``' lists, tuples, sets and dicts that a clone copies exactly."""
    found: dict[int, torch.Tensor] = {}
    todo: list[object] = [args]
    seen: set[int] = set()
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if type(x) is torch.Tensor:
            found[id(x)] = x
        elif isinstance(x, (list, tuple, set, frozenset)):
            todo.extend(x)
        elif isinstance(x, dict):
            todo.extend(x.keys())
            todo.extend(x.values())
    tensors: Sequence[torch.Tensor] = list(found.values())
    storages = Counter(_storage(t) for t in tensors)
    return [t for t in tensors if _plain(t) and storages[_storage(t)] == 1]


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr() if t.layout == torch.strided and t.numel() else -id(t)


def _plain(t: torch.Tensor) -> bool:
    return (
        t.layout == torch.strided
        and not t.is_quantized
        and t.is_leaf
        and t.grad is None
        and t.is_contiguous()
        and not t.__dict__
    )
