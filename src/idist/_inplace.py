"""Writing a collective's result into the caller's tensor, as raw torch.distributed does.

torch.distributed's C++ ops write into a tensor's memory whatever autograd thinks of it (a
parameter, an inference tensor). idist's own writes are torch ops, so each runs under
``torch.no_grad()`` (in inference mode for an inference tensor) and never through a lazy
conjugate or negative bit; a tensor whose elements share memory (``expand()``) cannot hold a
result at all, which ``unwritable`` says before any data moves.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch

from ._errors import UnsupportedValueError


def writing(t: torch.Tensor) -> AbstractContextManager[object]:
    """Where a write into ``t`` is allowed: inference mode for an inference tensor, else no_grad."""
    return torch.inference_mode() if t.is_inference() else torch.no_grad()


def write(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst`` with ``src``'s values (same shape), whatever ``dst`` is to autograd."""
    if not (dst.requires_grad or dst.is_inference()):
        return dst.copy_(src)  # the common case, without entering a mode
    with writing(dst):
        dst.copy_(src)
    return dst


def divide(t: torch.Tensor, n: int) -> None:
    """``t /= n`` in place (AVERAGE after a SUM), whatever ``t`` is to autograd."""
    if not (t.requires_grad or t.is_inference()):
        t.div_(n)
        return
    with writing(t):
        t.div_(n)


def plain(t: torch.Tensor) -> bool:
    """Whether ``t``'s memory holds its values (no lazy conjugate or negative bit)."""
    return not (t.is_conj() or t.is_neg())


def resolved(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in memory of their own when ``t`` is a lazy conjugate or negative view."""
    return t if plain(t) else t.resolve_conj().resolve_neg()


def shares_elements(t: torch.Tensor) -> bool:
    """Whether some elements of ``t`` are one memory location (a stride 0: ``expand()``)."""
    strides = t.stride()
    return 0 in strides and any(stride == 0 and size > 1 for stride, size in zip(strides, t.shape, strict=True))


def unwritable(t: torch.Tensor, call: str) -> UnsupportedValueError | None:
    """Why ``call`` cannot write its result into ``t``, or None."""
    if shares_elements(t):
        return UnsupportedValueError(
            f"{call} cannot write its result into a tensor whose elements share memory (an expand()ed "
            f"tensor of shape {list(t.shape)}); pass t.clone() or t.contiguous()"
        )
    return None


def check_writable(t: torch.Tensor, call: str) -> None:
    """Raise ``unwritable``'s error, if any (a contiguous tensor is writable: no stride 0 there)."""
    if not t.is_contiguous() and (error := unwritable(t, call)) is not None:
        raise error
