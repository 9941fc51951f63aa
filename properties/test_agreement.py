"""Every rank ends a collective with the same value or the same exception class, and the next
call pairs right: random values of random types on each rank, for all_reduce, all_gather and
broadcast (docs/semantics.md, "Errors are the same on every rank").

Each rank draws its own value: Python numbers, numpy scalars, enums, flags, bytearray, paths,
strings, containers, tensors of any dtype and shape (conjugated views, expanded ones,
parameters), a value that does not pickle and one that does not unpickle. Unchecked (the
Horovod and XLA runners), an all_reduce whose tensors differ between ranks cannot be told
apart before data moves (docs/failures.md): there every rank reduces rank 0's value instead.
"""

from __future__ import annotations

import struct
import threading
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from idist import DistContext, IdistError
from idist.testing import Runner

from ._payloads import Bomb, Color, Perm
from ._support import MOVE_DTYPES, OPS, any_float, any_text, int64s, random_bits, shapes

# A rank's value, as something that pickles to the rank (a runner may ship arguments to
# processes): a marker for what cannot travel as itself, a spec for tensors.
Spec = tuple[str, Any]


def _tensor_spec() -> st.SearchStrategy[Spec]:
    return st.tuples(
        st.sampled_from(MOVE_DTYPES), shapes(max_dims=2, max_side=3), st.integers(0, 2**16),
        st.sampled_from(["plain", "conj", "expanded", "param", "strided"]),
    ).map(lambda t: ("tensor", t))  # fmt: skip


def specs() -> st.SearchStrategy[Spec]:
    numbers = st.one_of(
        int64s(), any_float(), st.booleans(),
        st.builds(np.int64, st.integers(-(2**40), 2**40)), st.builds(np.float32, st.floats(width=32)),
        st.builds(np.bool_, st.booleans()), st.sampled_from([Color.RED, Perm.R | Perm.W]),
    )  # fmt: skip
    others = st.one_of(
        any_text(), st.binary(max_size=8), st.binary(max_size=8).map(bytearray), st.none(),
        st.sampled_from([PurePosixPath("/a/b"), PureWindowsPath("C:\\x"), [1, "two"], {"k": 0.5}]),
    )  # fmt: skip
    marks = st.sampled_from([("mark", "unpicklable"), ("mark", "bomb")])
    return st.one_of(numbers.map(lambda v: ("value", v)), others.map(lambda v: ("value", v)), _tensor_spec(), marks)


def build(spec: Spec) -> object:
    kind, what = spec
    if kind == "value":
        return what
    if kind == "mark":
        return threading.Lock() if what == "unpicklable" else Bomb()
    dtype, shape, seed, form = what
    t = random_bits(dtype, shape, seed)
    if form == "conj" and t.is_complex():
        return t.conj()
    if form == "expanded" and t.dim() >= 1 and t.shape[-1] == 1:
        return t.expand(*t.shape[:-1], 3)
    if form == "param" and (t.is_floating_point() or t.is_complex()):
        return torch.nn.Parameter(t)
    if form == "strided" and t.dim() == 2:
        return t.t()
    return t


def _tensors_differ(values: list[Spec]) -> bool:
    return any(v[0] == "tensor" for v in values) and len({repr(v) for v in values}) > 1


def one_call(ctx: DistContext, call: str, values: list[Spec], op: str, src: int) -> tuple[tuple[str, Any], Any]:
    """This rank's outcome of the call, then what the next call (a gather of ranks) gave."""
    if call == "all_reduce" and not ctx.checked and _tensors_differ(values):
        values = [values[0]] * len(values)  # unchecked: see the module docstring
    x = build(values[ctx.rank])
    try:
        if call == "all_reduce":
            got: object = ctx.all_reduce(x, op)  # type: ignore[call-overload]
        elif call == "all_gather":
            got = ctx.all_gather(x)
        else:
            got = ctx.broadcast(x, src)
        result: tuple[str, Any] = ("ok", portable(got))
    except IdistError as exc:
        result = ("err", type(exc).__name__)
    return result, ctx.all_gather(("next", ctx.rank))


def portable(v: object) -> object:
    """``v`` as plain data that compares exactly: floats and numpy scalars by their bits,
    tensors by dtype, shape and bytes, enums and flags by type and value."""
    if isinstance(v, torch.Tensor):
        t = v.detach().resolve_conj().resolve_neg().contiguous()
        return ("tensor", str(t.dtype), tuple(t.shape), bytes(t.reshape(-1).view(torch.uint8).tolist()))
    if isinstance(v, np.generic):
        return ("numpy", type(v).__name__, v.tobytes())
    if isinstance(v, float):
        return (type(v).__name__, struct.pack("<d", v))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [portable(x) for x in v])
    if isinstance(v, dict):
        return ("dict", [(k, portable(x)) for k, x in v.items()])
    return (type(v).__name__, repr(v))


@given(
    call=st.sampled_from(["all_reduce", "all_gather", "broadcast"]),
    op=st.sampled_from(OPS),
    data=st.data(),
)
def test_every_rank_agrees_and_the_next_call_pairs(runner: Runner, call: str, op: str, data: st.DataObject) -> None:
    n = runner.world_size
    values = data.draw(st.lists(specs(), min_size=n, max_size=n))
    src = data.draw(st.integers(0, n - 1))
    results = runner.run(one_call, call, values, op, src)
    first = results[0][0]
    for rank, (outcome, after) in enumerate(results):
        assert outcome == first, (call, op, values, rank, outcome, first)
        assert after == [("next", r) for r in range(n)], (call, rank, after)
    if first[0] == "ok" and call == "broadcast" and values[src][0] == "value":
        assert first[1] == portable(values[src][1]), (first, values[src])  # src's value, type and all
