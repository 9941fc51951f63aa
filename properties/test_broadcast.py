"""``broadcast``: every rank gets src's exact value; tensors in place when they fit."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st

from idist import DistContext
from idist.testing import Runner

from ._support import (
    MOVE_DTYPES,
    encodable,
    outcome,
    plain_values,
    random_bits,
    raw,
    same_error_everywhere,
    same_tensor,
    same_value,
)

#: what a receiver passes: nothing, a tensor that fits, one that does not, a strided one that fits, anything,
#: or one shaped like the previous step's tensor (it fits only when src's shape and dtype repeat)
RECEIVERS = ("none", "fits", "wrong_shape", "wrong_dtype", "strided_fit", "placeholder", "like_before")


def broadcast_value(
    ctx: DistContext, value: Any, src: int, placeholders: list[Any], safe: bool
) -> tuple[str, object, bool]:
    mine = value if ctx.rank == src else placeholders[ctx.rank]
    status, got = outcome(lambda: ctx.broadcast(mine, src=src, safe_mode=safe))
    return status, got, got is mine


def _receiver(kind: str, like: torch.Tensor, before: tuple[torch.dtype, tuple[int, ...]] | None) -> Any:
    if kind == "like_before":
        return torch.zeros(before[1], dtype=before[0]) if before is not None else None
    if kind == "none":
        return None
    if kind == "fits":
        return torch.zeros_like(like)
    if kind == "wrong_shape":
        return torch.zeros(like.numel() + 1, dtype=like.dtype)
    if kind == "wrong_dtype":
        return torch.zeros(like.shape, dtype=torch.float64 if like.dtype != torch.float64 else torch.int8)
    if kind == "strided_fit" and like.dim() >= 2:
        return torch.zeros(tuple(reversed(like.shape)), dtype=like.dtype).transpose(0, like.dim() - 1)
    if kind == "strided_fit":
        return torch.zeros_like(like)
    return "placeholder"


def broadcast_tensor(
    ctx: DistContext, dtype: torch.dtype, shape: tuple[int, ...], seed: int, src: int, kinds: list[str],
    before: tuple[torch.dtype, tuple[int, ...]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    source = random_bits(dtype, shape, seed)
    mine = source.clone() if ctx.rank == src else _receiver(kinds[ctx.rank], source, before)
    ptr = mine.data_ptr() if isinstance(mine, torch.Tensor) else None
    got = ctx.broadcast(mine, src=src)
    return {
        "value": got.clone(),
        "identity": got is mine,
        "same_memory": isinstance(mine, torch.Tensor) and mine.data_ptr() == ptr,
        "receiver_value": mine.clone() if isinstance(mine, torch.Tensor) else None,
        "receiver_kind": (tuple(mine.shape), mine.dtype) if isinstance(mine, torch.Tensor) else None,
    }


Step = tuple[torch.dtype, tuple[int, ...], int, int, list[str]]


def broadcast_steps(ctx: DistContext, steps: list[Step]) -> list[dict[str, Any]]:
    for src in range(ctx.world_size):  # a Python value from every src: no tensor before the steps
        ctx.broadcast(None, src=src)
    befores = [None, *((dtype, shape) for dtype, shape, *_ in steps)]
    return [broadcast_tensor(ctx, *step, before) for step, before in zip(steps, befores, strict=False)]


def broadcast_bad_src(ctx: DistContext, src: Any) -> tuple[str, object]:
    return outcome(lambda: ctx.broadcast(ctx.rank, src=src))


@given(data=st.data(), value=plain_values(), safe=st.booleans())
def test_python_values_from_any_src_exactly(runner: Runner, data: st.DataObject, value: Any, safe: bool) -> None:
    """Any src; receivers pass None or any placeholder; every rank returns src's value exactly
    (src gets its own object back)."""
    n = runner.world_size
    src = data.draw(st.integers(0, n - 1))
    placeholders = data.draw(st.lists(st.one_of(st.none(), plain_values()), min_size=n, max_size=n))
    results = runner.run(broadcast_value, value, src, placeholders, safe)
    if not encodable(value):
        # a value src cannot encode fails the call on every rank, never just on src
        assert {(s, g) for s, g, _ in results} == {("err", "UnsupportedValueError")}, results
        return
    for rank, (status, got, identity) in enumerate(results):
        assert status == "ok" and same_value(got, value), (rank, src, got, value)
        if rank == src:
            assert identity


#: small (inline), empty and large (> 64 KiB for 8-byte dtypes, or for all at 30 000) shapes
TENSOR_SHAPES = st.one_of(
    st.lists(st.integers(0, 5), max_size=3).map(tuple), st.sampled_from([(9000,), (300, 40), (30000,), (0, 9000)])
)


@given(
    pool=st.lists(st.tuples(st.sampled_from(MOVE_DTYPES), TENSOR_SHAPES), min_size=1, max_size=3),
    data=st.data(),
)
def test_tensors_land_in_place_when_they_fit(
    runner: Runner, pool: list[tuple[torch.dtype, tuple[int, ...]]], data: st.DataObject
) -> None:
    """A run of broadcasts, any src, any dtype, small (inline) and large tensors, src's shape
    repeating or changing: every rank gets src's bytes; a receiver whose tensor has the same
    shape and dtype gets it filled in place (the same object, its memory, even when strided);
    otherwise a new tensor. A receiver tensor that does not fit is left as it was, unless it has
    the shape and dtype of the large tensor the same src broadcast just before (the data may then
    have moved with the header, before the receiver learned src's shape)."""
    n = runner.world_size
    steps: list[Step] = []
    for _ in range(data.draw(st.integers(1, 4))):
        dtype, shape = data.draw(st.sampled_from(pool))
        src = data.draw(st.integers(0, n - 1))
        kinds = data.draw(st.lists(st.sampled_from(RECEIVERS), min_size=n, max_size=n))
        steps.append((dtype, shape, data.draw(st.integers(0, 2**31)), src, kinds))
    per_rank = runner.run(broadcast_steps, steps)
    last: dict[int, tuple[tuple[int, ...], torch.dtype] | None] = {}
    for i, (dtype, shape, seed, src, kinds) in enumerate(steps):
        expected = random_bits(dtype, shape, seed)
        for rank in range(n):
            r = per_rank[rank][i]
            where = (i, rank, src, kinds[rank], dtype, shape)
            assert same_tensor(r["value"], expected), where
            fits = kinds[rank] in ("fits", "strided_fit") or r["receiver_kind"] == (shape, dtype)
            if rank == src or fits:
                assert r["identity"] and r["same_memory"], where
            if rank != src and fits:
                assert same_tensor(r["receiver_value"], expected), where
            if rank != src and not fits:
                assert not r["identity"], where
            if rank != src and r["receiver_kind"] is not None and not fits and r["receiver_kind"] != last.get(src):
                assert not any(raw(r["receiver_value"])), where  # a tensor that does not fit is left as it was
        large = expected.numel() * expected.element_size() > 65536
        last[src] = (shape, dtype) if large else None


@given(data=st.data())
def test_a_bad_src_raises_on_every_rank(runner: Runner, data: st.DataObject) -> None:
    n = runner.world_size
    src = data.draw(
        st.one_of(st.integers(max_value=-1), st.integers(min_value=n), st.sampled_from([True, 0.0, "0", None]))
    )
    same_error_everywhere(runner.run(broadcast_bad_src, src), "CollectiveInputError")
