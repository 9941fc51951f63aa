"""The collectives, written once over a context's hooks and its comm's byte exchange.

``DistContext``'s methods check their arguments and find the comm; these functions do the
work. A backend context contributes the tensor primitives (``_allreduce_tensor``,
``_broadcast_tensor``); Python values and variable-shape tensors move as frames
(``_codec``) through the comm's byte collectives (``_exchange``).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from . import _codec, _exchange, _frame, _inplace, _speculative
from ._errors import CollectiveInputError, IdistError
from ._reduce import check_number, check_op_name, fold_values

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
        check_number(x)
        return fold_values(op, [x])
    # Every rank's exact value, folded in rank order: the same bits on every rank. Never through the
    # tensor all_reduce: a peer that passed a tensor waits in another collective, which the native
    # guard reports on every rank (gloo would mix its bytes with the number's, or abort).
    values = ctx._numbers(comm, x, op)
    return fold_values(op, values if values is not None else gathered_numbers(comm, x))


def gathered_numbers(comm: _exchange.Comm, x: object) -> list[object]:
    """Every rank's ``x`` for all_reduce, gathered as frames: a rank whose ``x`` all_reduce refuses
    ships its error, which every rank raises."""
    try:
        check_number(x)
        frame = _codec.encode(x)
    except IdistError as exc:
        frame = _codec.encode_error(exc)
    out, size = _exchange.gather_slots(comm, frame)
    n = len(comm.ranks)
    values = _codec.numbers(out, size, n)
    if values is None:  # an error, a numpy scalar, an int past int64: decoded in full
        values = _exchange.decode_all(comm, [out[r * size : (r + 1) * size] for r in range(n)], "all_reduce")
    return values


def all_gather(comm: _exchange.Comm, x: object, declared: Declared = None) -> list[Any]:
    """One entry per rank of ``comm``, in rank order (see ``DistContext.all_gather``); with
    ``declared`` (``all_gather_tensors_with_shapes``), this rank's tensor must have that shape."""
    if len(comm.ranks) == 1:  # a group of one: the same checks and copy, nothing to exchange
        _check_declared(x, declared)
        if isinstance(x, torch.Tensor):
            return [_codec.checked_tensor(x).detach().clone()]
        return [_codec.decode(_codec.encode(x).to_tensor())]
    try:
        _check_declared(x, declared)
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


#: the shape a rank declared for its own tensor (``all_gather_tensors_with_shapes``), or
#: what is wrong with the shapes it passed; None: nothing declared
Declared = tuple[int, ...] | IdistError | None


def declared_shape(shapes: object, group_rank: int, size: int) -> Declared:
    """This rank's entry of ``shapes`` (one shape per group rank), or the error in ``shapes``."""
    rows = [_shape(s) for s in shapes] if isinstance(shapes, Iterable) else []
    mine = rows[group_rank] if len(rows) == size else None
    if mine is None or None in rows:
        return CollectiveInputError(
            f"all_gather_tensors_with_shapes: shapes must hold one shape (a sequence of ints) per rank of the "
            f"group ({size}), got {shapes!r}"
        )
    return mine


def _shape(s: object) -> tuple[int, ...] | None:
    try:
        return tuple(operator.index(d) for d in s) if isinstance(s, Iterable) else None
    except TypeError:
        return None


def _check_declared(x: object, declared: Declared) -> None:
    if isinstance(declared, IdistError):
        raise declared
    if declared is not None and not (isinstance(x, torch.Tensor) and tuple(x.shape) == declared):
        got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise CollectiveInputError(
            f"all_gather_tensors_with_shapes: this rank's tensor is {got}, not the declared {list(declared)}; "
            "pass shapes= in group-rank order, one per rank"
        )


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


def broadcast(ctx: DistContext[CommT], comm: CommT, x: object, src: int) -> object:
    """``src``'s value (``src`` a global rank of ``comm``) on every rank of ``comm``; src's own
    tensor is only read, a receiver's is filled when it can hold the value (``_inplace``)."""
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
    if tag is not _frame.Tag.TENSOR:
        # src decodes its own frame too when it is a pickle or an error: every rank raises alike
        if tag is _frame.Tag.PICKLE and comm.confirms:  # ... also when only some ranks cannot load it
            value = _exchange.confirmed(comm, lambda: _exchange.decode_from(buf, src, "broadcast"))
        else:
            value = _exchange.decode_from(buf, src, "broadcast") if not me or tag in _SRC_DECODES else x
        return x if me else value
    if landed is not None and seen == expected:  # the data came with the header
        return x if me or landed is x else _received(x, landed)
    dtype = _codec.DTYPES[code]
    if me and isinstance(x, torch.Tensor):
        target = x  # only read: the comm sends a copy of a tensor it cannot send as it is
    elif isinstance(x, torch.Tensor) and _speculative.fits(x, (shape, dtype)) and not _inplace.shares_elements(x):
        target = x
    else:
        target = torch.empty(shape, dtype=dtype, device=ctx._receive_device(dtype))
    if seen is not None:
        ctx._broadcast_tensor(target, gsrc, comm)
    elif not me:
        _inplace.write(target, _codec.decode_tensor(buf))
    return target


#: the frames src decodes itself after sending them (see ``broadcast``)
_SRC_DECODES = (_frame.Tag.PICKLE, _frame.Tag.ERROR)


def _received(x: object, data: torch.Tensor) -> torch.Tensor:
    """A receiver's result when the data landed in a new tensor: into ``x`` if it has the shape."""
    if isinstance(x, torch.Tensor) and _speculative.fits(x, (tuple(data.shape), data.dtype)):
        if not _inplace.shares_elements(x):
            return _inplace.write(x, data)
    return data


def _broadcast_frame(x: object) -> _frame.Frame:
    try:
        if isinstance(x, torch.Tensor) and x.numel() * x.element_size() > INLINE_TENSOR_BYTES:
            return _codec.tensor_header(x)
        return _codec.encode(x)
    except IdistError as exc:
        return _codec.encode_error(exc)
