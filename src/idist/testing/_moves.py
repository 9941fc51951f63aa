"""How a simulated collective moves data, and what it refuses: exactly what gloo does.

The last rank to arrive at a collective calls its *move* with every member's payload, in
group rank order: a reduction folds the ranks' tensors left to right into one result and
copies it to every member (so every rank ends with the same bytes); a broadcast copies the
root's tensors; a gather copies every input into every output. ``check`` refuses, before
the call meets its peers, what gloo refuses: its dtypes, its ops per dtype, dense CPU tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

_OP = dist.ReduceOp
#: the dtypes gloo moves (torch 2.13): anything else fails there with "Invalid scalar type"
GLOO_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64}
    | {torch.bool}
)
#: complex tensors too, but not in allgather, and reduced only by SUM and AVG
_COMPLEX = frozenset({torch.complex64, torch.complex128})
_BITWISE = frozenset({_OP.BAND, _OP.BOR, _OP.BXOR})
_FOLDS: dict[object, Callable[[torch.Tensor, torch.Tensor], object]] = {
    _OP.SUM: torch.Tensor.add_,
    _OP.PRODUCT: torch.Tensor.mul_,
    _OP.MIN: lambda acc, t: torch.minimum(acc, t, out=acc),
    _OP.MAX: lambda acc, t: torch.maximum(acc, t, out=acc),
    _OP.BAND: torch.Tensor.bitwise_and_,
    _OP.BOR: torch.Tensor.bitwise_or_,
    _OP.BXOR: torch.Tensor.bitwise_xor_,
}


def check(t: torch.Tensor, call: str, op: object = None) -> None:
    """Refuse what gloo refuses, with its words (a ``RuntimeError`` on this rank alone, as gloo's)."""
    if t.dtype not in GLOO_DTYPES and (call == "allgather" or t.dtype not in _COMPLEX):
        raise RuntimeError(f"{call}: Invalid scalar type {t.dtype} (gloo has no kernel for it)")
    if not t.is_contiguous() or t.layout != torch.strided or t.device.type != "cpu":
        raise RuntimeError(f"{call}: gloo takes contiguous dense CPU tensors only")
    if op is None:
        return
    if t.dtype in _COMPLEX and op not in (_OP.SUM, _OP.AVG):
        raise RuntimeError("all_reduce does not support this op on complex tensors")
    if op in _BITWISE and (t.dtype.is_floating_point or t.dtype.is_complex):
        raise RuntimeError(f"Cannot use ReduceOp.{op} with non-integral dtype")
    if op == _OP.AVG and not (t.dtype.is_floating_point or t.dtype.is_complex):
        raise RuntimeError(f"AVG: result type Float can't be cast to the desired output type {t.dtype}")


def _same_size(tensors: list[torch.Tensor], call: str) -> None:
    first = tensors[0]
    for t in tensors:
        if t.dtype != first.dtype or t.numel() != first.numel():
            raise ValueError(f"{call}: ranks passed tensors of different sizes or dtypes")


def allreduce(op: object) -> Callable[[list[Any]], None]:
    fold = _FOLDS[_OP.SUM if op == _OP.AVG else op]

    def move(payloads: list[list[torch.Tensor]]) -> None:
        for i in range(len(payloads[0])):
            column = [p[i] for p in payloads]
            _same_size(column, "allreduce")
            acc = column[0].detach().clone()
            for t in column[1:]:
                fold(acc, t.detach())
            if op == _OP.AVG:
                acc.div_(len(column))
            for t in column:
                t.detach().copy_(acc)

    return move


def broadcast(root: int) -> Callable[[list[Any]], None]:
    def move(payloads: list[list[torch.Tensor]]) -> None:
        for i, src in enumerate(payloads[root]):
            column = [p[i] for p in payloads]
            _same_size(column, "broadcast")
            for t in column:
                if t is not src:
                    t.detach().copy_(src)

    return move


def allgather(payloads: list[tuple[list[torch.Tensor] | torch.Tensor, torch.Tensor]]) -> None:
    inputs = [p[1].detach() for p in payloads]
    _same_size(inputs, "allgather")
    n = inputs[0].numel()
    flat: torch.Tensor | None = None
    for outputs, _ in payloads:
        if isinstance(outputs, torch.Tensor):  # one flat buffer (_allgather_base)
            if outputs.numel() != n * len(inputs) or outputs.dtype != inputs[0].dtype:
                raise ValueError("allgather: the output buffer does not fit the inputs")
            flat = torch.cat([t.reshape(n) for t in inputs]) if flat is None else flat
            outputs.detach().view(-1).copy_(flat)
            continue
        if len(outputs) != len(inputs) or any(o.numel() != n or o.dtype != inputs[0].dtype for o in outputs):
            raise ValueError("allgather: an output does not fit the inputs")
        for out, t in zip(outputs, inputs, strict=True):
            out.detach().copy_(t.view_as(out))


def alltoall(payloads: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Equal parts: part j of rank i's input lands as part i of rank j's output."""
    inputs = [p[1].detach() for p in payloads]
    _same_size(inputs, "alltoall")
    n = len(inputs)
    if inputs[0].numel() % n:
        raise ValueError("alltoall: the input does not split into one equal part per rank")
    parts = [t.reshape(-1).chunk(n) for t in inputs]
    for j, (output, _) in enumerate(payloads):
        if output.numel() != inputs[0].numel() or output.dtype != inputs[0].dtype:
            raise ValueError("alltoall: the output buffer does not fit the inputs")
        output.detach().view(-1).copy_(torch.cat([parts[i][j] for i in range(n)]))


def barrier(payloads: list[Any]) -> None:
    """Nothing moves: every member arrived."""


#: the reduce ops gloo has
OPS = frozenset({*_FOLDS, _OP.AVG})
