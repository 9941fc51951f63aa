"""Pickling results between Horovod ranks and the test process, tensors as raw bytes.

torch 2.13 pickles uint16/uint32/uint64 tensors in a form it cannot load back
(``UntypedStorage has no attribute 'dtype'``), so tensors travel as (dtype, shape, bytes).
"""

from __future__ import annotations

import copyreg
import io
import pickle
from typing import Any

import torch


def rebuild_tensor(dtype: str, shape: tuple[int, ...], data: bytes) -> torch.Tensor:
    dt = getattr(torch, dtype.removeprefix("torch."))
    if not data:
        return torch.empty(shape, dtype=dt)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dt).reshape(shape).clone()


def _reduce_tensor(t: torch.Tensor) -> tuple[Any, tuple[str, tuple[int, ...], bytes]]:
    raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return rebuild_tensor, (str(t.dtype), tuple(t.shape), bytes(raw.numpy().tobytes()) if raw.numel() else b"")


def dumps(obj: object) -> bytes:
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = copyreg.dispatch_table.copy()
    pickler.dispatch_table[torch.Tensor] = _reduce_tensor
    pickler.dump(obj)
    return buf.getvalue()
