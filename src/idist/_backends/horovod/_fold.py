"""What Horovod cannot reduce natively: exact rank-order folds and the Adasum emulation."""

from __future__ import annotations

from collections.abc import Callable

import torch

#: dtypes Horovod's allreduce takes as they are
NATIVE_REDUCE = (torch.int32, torch.int64, torch.float16, torch.float32, torch.float64)
#: dtypes reduced in a wider native dtype, then cast back (integer wrap-around as in torch)
WIDEN = {
    torch.bool: torch.int32,
    torch.uint8: torch.int64,
    torch.int8: torch.int64,
    torch.int16: torch.int64,
    torch.uint16: torch.int64,
    torch.uint32: torch.int64,
    torch.bfloat16: torch.float32,
}
#: Horovod's Adasum treats vectors whose squared norm is below this as zero
_ADASUM_EPS = 1e-8

_FOLDS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "SUM": lambda a, b: a + b,
    "PRODUCT": lambda a, b: a * b,
    "MIN": torch.minimum,
    "MAX": torch.maximum,
    "AND": torch.bitwise_and,
    "OR": torch.bitwise_or,
}


def fold_tensors(op: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    """Exact rank-order fold for what Horovod cannot reduce natively."""
    dtype = tensors[0].dtype
    if dtype == torch.uint64:
        # torch has few uint64 kernels: fold the same bits as int64; flipping the top bit
        # maps unsigned order onto signed order for MIN/MAX.
        flip = op in ("MIN", "MAX")
        top = torch.tensor(-(2**63), dtype=torch.int64)
        signed = [t.contiguous().view(torch.int64) ^ top if flip else t.contiguous().view(torch.int64) for t in tensors]
        acc = fold_tensors(op, signed)
        return (acc ^ top if flip else acc).view(torch.uint64)
    if dtype in (torch.uint16, torch.uint32):
        return fold_tensors(op, [t.to(torch.int64) for t in tensors]).to(dtype)
    acc = tensors[0].clone()
    for t in tensors[1:]:
        acc = _FOLDS[op](acc, t)
    return acc


def adasum_combine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Horovod's pairwise Adasum step: dot products in float64, scaled sum in the dtype."""
    a64, b64 = a.double().reshape(-1), b.double().reshape(-1)
    dot = float(a64 @ b64)
    anormsq, bnormsq = float(a64 @ a64), float(b64 @ b64)
    acoeff = 1.0 - dot / anormsq * 0.5 if anormsq >= _ADASUM_EPS else 1.0
    bcoeff = 1.0 - dot / bnormsq * 0.5 if bnormsq >= _ADASUM_EPS else 1.0
    return a * acoeff + b * bcoeff


def adasum_tree(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Combine a power-of-two list pairwise, neighbours first, as Horovod's tree does."""
    level = list(tensors)
    while len(level) > 1:
        level = [adasum_combine(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]
