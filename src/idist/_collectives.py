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

from . import _codec, _exchange, _frame, _number_sum, _speculative
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
    n = len(comm.ranks)
    summing = ctx.EXACT_SUM_PAIRS and op in _number_sum.OPS and n < _number_sum.MAX_RANKS
    step = comm.lockstep
    if summing and (mode := step.sum_mode) != "gather":
        summed = _number_sum.contribution(x, op, mode)
        ctx._allreduce_tensor(summed, "SUM", comm)
        result = _number_sum.result(summed, n, op, mode)
        if not isinstance(result, _number_sum.Miss):
            step.sum_mode = _number_sum.after_sum(result, n)
            return result
    try:
        check_value_op(op, x)
        frame = _codec.encode(x, allow_pickle=False)
    except IdistError as exc:
        frame = _codec.encode_error(exc)
    values = _exchange.decode_all(comm, _exchange.gather_frames(comm, frame), "all_reduce")
    if summing:
        step.sum_mode = _number_sum.after_gather(values)
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
    out, size = _exchange.gather_slots(comm, frame)
    n = len(comm.ranks)
    if isinstance(x, torch.Tensor) and x.is_cpu and frame.head[8] == _frame.Tag.TENSOR:
        if _exchange.all_start_with(out, size, n, frame.head):  # every rank sent x's dtype and shape
            return _rows(out, size, n, len(frame.head), x)
    bufs = [out[r * size : (r + 1) * size] for r in range(n)]
    values = _exchange.decode_all(comm, bufs, "all_gather")
    if isinstance(x, torch.Tensor) or any(isinstance(v, torch.Tensor) for v in values):
        # also on the ranks that passed no tensor, so that every rank raises the mix
        return _gathered_tensors(x, values, comm.ranks)
    return values


def _rows(out: torch.Tensor, size: int, n: int, start: int, like: torch.Tensor) -> list[torch.Tensor]:
    """The ``n`` gathered tensors shaped like ``like``: views of ``out``, whose slots hold them at ``start``."""
    item = like.element_size()
    shape = tuple(like.shape)
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    # slots are multiples of 64 bytes and payloads start 16-byte aligned: whole elements
    rows = out.view(like.dtype).as_strided((n, *shape), (size // item, *strides), start // item)
    return list(rows.unbind(0))


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
    pipe = ctx._pipeline(comm)
    expected = _speculative.guess(pipe, gsrc) if pipe is not None else None
    if pipe is not None and expected is not None:
        buf, landed = _speculative.send(pipe, frame, x, gsrc, expected)
    else:
        buf, landed = _exchange.broadcast_frame(comm, frame, gsrc), None
    tag, code, shape = _frame.peek(buf)
    # a large tensor's frame is its header alone (every other frame holds its payload)
    header_only = tag is _frame.Tag.TENSOR and _frame.frame_length(buf) == _frame.payload_start(len(shape))
    seen = (shape, _codec.DTYPES[code]) if header_only and 0 not in shape else None
    if pipe is not None:
        _speculative.remember(pipe, gsrc, seen)
    if tag is _frame.Tag.ERROR:
        _exchange.decode_all(comm, [buf], "broadcast")
    if tag is not _frame.Tag.TENSOR:
        return x if me else _codec.decode(buf)
    if landed is not None and seen == expected:  # the data came with the header
        return x if me or landed is x else _received(x, landed)
    dtype = _codec.DTYPES[code]
    if me and isinstance(x, torch.Tensor):
        target = x
    elif isinstance(x, torch.Tensor) and x.dtype == dtype and tuple(x.shape) == shape:
        target = x
    else:
        target = torch.empty(shape, dtype=dtype, device=ctx._receive_device(dtype))
    if seen is not None:
        ctx._broadcast_tensor(target, gsrc, comm)
    elif not me:
        _fill(target, _codec.decode_tensor(buf))
    return target


def _received(x: object, data: torch.Tensor) -> torch.Tensor:
    """A receiver's result when the data landed in a new tensor: into ``x`` if it has the shape."""
    if isinstance(x, torch.Tensor) and _speculative.fits(x, (tuple(data.shape), data.dtype)):
        return _fill(x, data)
    return data


def _fill(target: torch.Tensor, data: torch.Tensor) -> torch.Tensor:
    """``target.copy_(data)``; a Parameter that requires grad is filled too, as torch.distributed's
    broadcast fills it (autograd refuses an in-place copy into a leaf that requires grad)."""
    if target.requires_grad:
        with torch.no_grad():
            return target.copy_(data)
    return target.copy_(data)


def _broadcast_frame(x: object) -> _frame.Frame:
    try:
        if isinstance(x, torch.Tensor) and x.numel() * x.element_size() > INLINE_TENSOR_BYTES:
            return _codec.tensor_header(x)
        return _codec.encode(x)
    except IdistError as exc:
        return _codec.encode_error(exc)
