"""The collectives, written once over a context's hooks and its comm's byte exchange.

``DistContext``'s methods check their arguments and find the comm; these functions do the
work. A backend context contributes the tensor primitives (``_allreduce_tensor``,
``_broadcast_tensor``); Python values and variable-shape tensors move as frames
(``_codec``) through the comm's byte collectives (``_exchange``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from . import _codec, _exchange, _frame, _number_sum
from ._errors import CollectiveInputError, IdistError
from ._reduce import check_op_name, check_value_op, fold_values

if TYPE_CHECKING:
    from ._context import DistContext
    from ._core import CommT

#: Tensors up to this many bytes ride inside the broadcast frame (one collective);
#: larger ones are broadcast straight into the receiver's tensor after a header round.
INLINE_TENSOR_BYTES = 1 << 16


def checked_op(
    ctx: DistContext, member: bool, x: object, op: str, error: IdistError | None
) -> tuple[str, IdistError | None]:
    """What this rank can tell alone about an all_reduce: the op's name and the error, if any."""
    if error is not None:
        return op, error
    try:
        name = check_op_name(op, ctx.VALID_OPS, ctx.backend)
        if member and isinstance(x, torch.Tensor):
            ctx._check_tensor(x, name)
    except IdistError as exc:
        return op, exc
    return name, None


def src_error(src: object, world_size: int, ranks: tuple[int, ...] | None) -> IdistError | None:
    """What is wrong with broadcast's ``src`` (a global rank, a member of ``ranks``), or None."""
    if not isinstance(src, int) or isinstance(src, bool) or not 0 <= src < world_size:
        return CollectiveInputError(f"broadcast src must be a global rank in 0..{world_size - 1}, got {src!r}")
    if ranks is not None and src not in ranks:
        return CollectiveInputError(f"broadcast src {src} is not in the group {list(ranks)}; pass a member rank")
    return None


def all_reduce(ctx: DistContext[CommT], comm: CommT, x: object, op: str) -> object:
    """``x`` reduced over ``comm``'s ranks with the (already valid) op ``op``."""
    if isinstance(x, torch.Tensor):  # checked by ctx._check_tensor before
        ctx._allreduce_tensor(x, op, comm)
        return x
    if len(comm.ranks) == 1:  # a group of one: the same checks, nothing to exchange
        check_value_op(op, x)
        return fold_values(op, [x])
    summing = ctx.EXACT_SUM_PAIRS and op in _number_sum.OPS and len(comm.ranks) < _number_sum.MAX_RANKS
    if summing and not comm.sum_by_gather:
        summed = _number_sum.pair(x, op)
        ctx._allreduce_tensor(summed, "SUM", comm)
        result = _number_sum.result(summed, len(comm.ranks), op)
        if not isinstance(result, _number_sum.Miss):
            return result
    try:
        check_value_op(op, x)
        frame = _codec.encode(x, allow_pickle=False)
    except IdistError as exc:
        frame = _codec.encode_error(exc)
    values = _exchange.decode_all(comm, _exchange.gather_frames(comm, frame), "all_reduce")
    if summing:
        comm.sum_by_gather = _number_sum.gather_next_time(values)
    return fold_values(op, values)


def all_gather(comm: _exchange.Comm, x: object) -> list[Any]:
    """One entry per rank of ``comm``, in rank order (see ``DistContext.all_gather``)."""
    if len(comm.ranks) == 1:  # a group of one: the same checks and copy, nothing to exchange
        if isinstance(x, torch.Tensor):
            return [_codec.checked_tensor(x).detach().clone()]
        return [_codec.decode(_codec.encode(x).to_tensor())]
    try:
        frame = _codec.encode(x)
    except IdistError as exc:
        frame = _codec.encode_error(exc)
    values = _exchange.decode_all(comm, _exchange.gather_frames(comm, frame), "all_gather")
    if isinstance(x, torch.Tensor) or any(isinstance(v, torch.Tensor) for v in values):
        # also on the ranks that passed no tensor, so that every rank raises the mix
        return _gathered_tensors(x, values, comm.ranks)
    return values


def _gathered_tensors(x: object, values: list[object], ranks: tuple[int, ...]) -> list[torch.Tensor]:
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if len(tensors) != len(values):
        kinds = {r: type(v).__name__ for r, v in zip(ranks, values, strict=False)}
        raise CollectiveInputError(f"all_gather got a tensor on some ranks only: {kinds}")
    dtype = tensors[0].dtype
    if any(t.dtype != dtype for t in tensors):
        dtypes = {r: t.dtype for r, t in zip(ranks, tensors, strict=False)}
        raise CollectiveInputError(
            f"all_gather needs the same dtype on every rank, got {dtypes}; cast with .to(dtype) before gathering"
        )
    if isinstance(x, torch.Tensor) and x.device.type != "cpu":
        tensors = [t.to(x.device) for t in tensors]
    return tensors


def with_shapes(gathered: list[torch.Tensor], shapes: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """``gathered``, once each rank's tensor is checked against its declared shape (the same on every rank)."""
    want = [tuple(int(d) for d in s) for s in shapes]
    got = [tuple(t.shape) for t in gathered]
    if want != got:
        raise CollectiveInputError(
            f"all_gather_tensors_with_shapes: the ranks' tensors have shapes {got}, not the declared {want}; "
            "pass shapes= in group-rank order, one per rank"
        )
    return gathered


def broadcast(ctx: DistContext[CommT], comm: CommT, x: object, src: int) -> object:
    """``src``'s value (``src`` a global rank of ``comm``) on every rank of ``comm``."""
    if len(comm.ranks) == 1:  # a group of one: src's value is this rank's, once checked
        if isinstance(x, torch.Tensor):
            _codec.checked_tensor(x)
        else:
            _codec.encode(x)
        return x
    gsrc = comm.ranks.index(src)
    me = comm.group_rank == gsrc
    frame = _broadcast_frame(x) if me else None
    buf = _exchange.broadcast_frame(comm, frame, gsrc)
    tag, code, shape = _frame.peek(buf)
    if tag is _frame.Tag.ERROR:
        _exchange.decode_all(comm, [buf], "broadcast")
    if tag is not _frame.Tag.TENSOR:
        return x if me else _codec.decode(buf)
    dtype = _codec.DTYPES[code]
    if me and isinstance(x, torch.Tensor):
        target = x
    elif isinstance(x, torch.Tensor) and x.dtype == dtype and tuple(x.shape) == shape:
        target = x
    else:
        target = torch.empty(shape, dtype=dtype, device=ctx._receive_device(dtype))
    inline = _frame.frame_length(buf) > _frame.payload_start(len(shape)) or target.numel() == 0
    if not inline:
        ctx._broadcast_tensor(target, gsrc, comm)
    elif not me:
        target.copy_(_codec.decode_tensor(buf))
    return target


def _broadcast_frame(x: object) -> _frame.Frame:
    try:
        if isinstance(x, torch.Tensor) and x.numel() * x.element_size() > INLINE_TENSOR_BYTES:
            return _codec.tensor_header(x)
        return _codec.encode(x)
    except IdistError as exc:
        return _codec.encode_error(exc)
