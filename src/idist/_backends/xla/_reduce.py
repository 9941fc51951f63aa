"""all_reduce and broadcast of tensors on XLA: exact bits, emulated ops, bystanders.

Broadcast moves a tensor's bits as same-width integers (src adds its bits, everyone else
zeros), so -0.0 and NaN payloads survive. AND/OR on integers gather and fold in rank order;
AVERAGE is SUM then a division; MIN/MAX propagate NaN (XLA's drop it) through a second
reduction of the NaN mask; bfloat16 reduces in float32 on the XLA CPU device.
"""

from __future__ import annotations

import math

import torch

from ..._inplace import resolved, write
from . import _lib
from ._comm import XlaComm

#: idist op -> xm reduce type (AVERAGE is SUM then a division; integer AND/OR are folded)
_XM_OPS = {"SUM": "sum", "AVERAGE": "sum", "PRODUCT": "mul", "MIN": "min", "MAX": "max", "AND": "and", "OR": "or"}
#: same-width integer dtype for moving a dtype's bits exactly
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _nan_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, math.nan)


def allreduce_tensor(t: torch.Tensor, op: str, comm: XlaComm, device_type: str) -> None:
    """Reduce ``t`` (agreed on every rank) in place; a bystander's result is dropped."""
    dev = comm.device
    dtype = t.dtype
    if t.numel() == 0:
        return  # agreed on every rank: nothing to reduce (XLA rejects empty gathers)
    if dtype.is_complex:
        # SUM/AVERAGE (the complex ops) act on the real and imaginary parts alike, and a
        # real view keeps complex128 exact (torch_xla drops its imaginary part on device).
        real = torch.view_as_real(t.detach().cpu().resolve_conj().contiguous())
        allreduce_tensor(real, op, comm, device_type)
        if not comm.bystander:
            write(t, torch.view_as_complex(real))
        return
    if t.dim() == 0 and t.device != dev.device:
        # torch_xla moves a 0-dim tensor as a scalar, which it may share with an equal
        # constant of the program (or fold into one): the ranks' programs then differ and
        # never meet. A 1-element vector (a view of t) moves as plain data.
        allreduce_tensor(t.reshape(1), op, comm, device_type)
        return
    if op in ("AND", "OR") and dtype != torch.bool:
        result = _fold_integers(t, op, comm)
    else:
        reduced = _reduce(t, op, comm, device_type)
        if reduced is None:
            return
        result = reduced
    if comm.bystander:
        dev.materialize([result])
        return
    if t.device == dev.device and not dev.ordered:
        write(t, result)  # stays lazy: runs with the rest of the step
        return
    write(t, dev.materialize([result])[0])


def _reduce(t: torch.Tensor, op: str, comm: XlaComm, device_type: str) -> torch.Tensor | None:
    """The lazy reduced tensor; None when ordered mode already finished (into ``t``)."""
    dev, dtype, groups = comm.device, t.dtype, comm.replica_groups
    src = dev.prepare(t)
    stage = torch.float32 if dtype == torch.bfloat16 and device_type == "CPU" else dtype
    work = src.to(stage) if stage != dtype else src
    reduced = _lib.xm.all_reduce(_XM_OPS[op], work, groups=groups)
    assert isinstance(reduced, torch.Tensor)
    nan: torch.Tensor | None = None
    if op in ("MIN", "MAX") and (dtype.is_floating_point or dtype.is_complex):
        got = _lib.xm.all_reduce("max", torch.isnan(work).to(torch.uint8), groups=groups)
        assert isinstance(got, torch.Tensor)
        nan = got
    if dev.ordered:
        # Finish on the CPU: a constant in the collective's program (the NaN, the
        # divisor) is device data torch_xla may share with an equal input value on
        # some ranks only, which again makes the ranks' programs differ.
        outs = dev.materialize([reduced] if nan is None else [reduced, nan])
        if comm.bystander:
            return None
        value = outs[0] if nan is None else torch.where(outs[1].bool(), _nan_like(outs[0]), outs[0])
        if op == "AVERAGE":
            value = value / len(comm.ranks)
        write(t, value.to(dtype))
        return None
    if nan is not None:
        reduced = torch.where(nan.bool(), _nan_like(reduced), reduced)
    if op == "AVERAGE":
        reduced = reduced / len(comm.ranks)
    return reduced.to(dtype) if reduced.dtype != dtype else reduced


def _fold_integers(t: torch.Tensor, op: str, comm: XlaComm) -> torch.Tensor:
    """Bitwise AND/OR (which XLA's all-reduce lacks): gather, then fold in rank order."""
    flat = comm.device.prepare(t).reshape(-1)  # t is not a 0-dim CPU tensor here (see allreduce_tensor)
    gathered: torch.Tensor = _lib.xm.all_gather(flat, pin_layout=False)
    n = flat.numel()
    parts = [gathered[r * n : (r + 1) * n] for r in comm.ranks]
    acc: torch.Tensor = parts[0]
    for part in parts[1:]:
        acc = torch.bitwise_and(acc, part) if op == "AND" else torch.bitwise_or(acc, part)
    return acc.reshape(t.shape)


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as same-width integers (a CPU tensor; a conjugated view's values, resolved)."""
    t = resolved(t.detach().cpu()).contiguous()
    if t.dtype == torch.complex128:
        return torch.view_as_real(t).view(torch.int64)
    return t.view(_BITS[t.element_size()])


def broadcast_tensor(t: torch.Tensor, src: int, comm: XlaComm) -> None:
    """``t`` in place from group rank ``src``, bit for bit (bystanders take part, keep theirs)."""
    raw = bits(t)
    mine = raw if comm.group_rank == src else torch.zeros_like(raw)
    got = comm.device.world_sum([mine])[0]
    if comm.group_rank != src and not comm.bystander:
        value = torch.view_as_complex(got.view(torch.float64)) if t.dtype == torch.complex128 else got.view(t.dtype)
        write(t, value.reshape(t.shape))
