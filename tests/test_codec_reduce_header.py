"""``_codec.reduce_header``: what an XLA rank announces before reducing a tensor, as a binary frame.

The XLA lane runs the agreement itself; this checks the frame on any machine: it decodes to
the same (op, dtype, shape), equal announcements are equal bytes, and any difference in op,
dtype or shape shows in the bytes (the bystanders compare them).
"""

from __future__ import annotations

import pytest
import torch

from idist import UnsupportedValueError
from idist._codec import DTYPES, ReduceHeader, decode, encode, reduce_header


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 1, 5)])
def test_a_header_decodes_to_its_op_dtype_and_shape(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    t = torch.zeros(shape, dtype=dtype)
    got = decode(reduce_header("AVERAGE", t).to_tensor())
    assert got == ReduceHeader("AVERAGE", dtype, shape)
    assert str(got) == f"AVERAGE of {dtype} {list(shape)}"


def test_equal_announcements_are_equal_bytes_and_any_difference_shows() -> None:
    base = reduce_header("SUM", torch.zeros(2, 3)).to_tensor()
    assert torch.equal(base, reduce_header("SUM", torch.ones(2, 3)).to_tensor())  # values do not matter
    for other in (
        reduce_header("MAX", torch.zeros(2, 3)),
        reduce_header("SUM", torch.zeros(2, 3, dtype=torch.float64)),
        reduce_header("SUM", torch.zeros(3, 2)),
        reduce_header("SUM", torch.zeros(6)),
        encode(torch.zeros(2, 3)),  # a tensor's own frame is not an announcement
    ):
        raw = other.to_tensor()
        assert raw.numel() != base.numel() or not torch.equal(raw, base)
        assert decode(raw) != decode(base)


def test_a_tensor_that_cannot_move_has_no_header() -> None:
    with pytest.raises(UnsupportedValueError):
        reduce_header("SUM", torch.empty(2, device="meta"))
