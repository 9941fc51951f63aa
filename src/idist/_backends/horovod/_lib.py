"""horovod.torch, imported on first selection, and its errors mapped to idist's in one place."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

from ..._errors import BackendUnavailableError, CollectiveInputError, CollectiveTimeoutError, PeerLostError

__all__ = ["INSTALL_HINT", "hvd", "load", "mapped_errors", "op_code"]

if TYPE_CHECKING:
    import horovod.torch as hvd
else:
    hvd = None  # the horovod.torch module once load() ran

INSTALL_HINT: Final = (
    "Horovod is not installed in this environment; install it with PyTorch support, e.g. "
    "HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 pip install --no-build-isolation horovod "
    "(or run scripts/horovod/build-wheel.sh and pip install the wheel it prints)"
)


def load() -> None:
    """Import horovod.torch once (it is slow and pulls its C library)."""
    global hvd
    if hvd is not None:
        return
    try:
        import horovod.torch as mod  # optional: imported on selection only
    except ImportError as exc:
        raise BackendUnavailableError(f"{INSTALL_HINT} ({exc})") from exc
    hvd = mod


def op_code(op: str) -> int:
    """Horovod's code for an idist op name (``_context`` emulates the ones Horovod lacks)."""
    return {
        "SUM": hvd.Sum,
        "AVERAGE": hvd.Average,
        "MIN": hvd.Min,
        "MAX": hvd.Max,
        "PRODUCT": hvd.Product,
        "ADASUM": hvd.Adasum,
    }[op]


@contextmanager
def mapped_errors(what: str) -> Iterator[None]:
    """Re-raise Horovod's errors that idist has a type for as that type (``from`` the original).

    "Mismatched ..." comes from Horovod's coordinator on every rank alike; "has been shut
    down" is what a rank blocked in a collective gets when a peer raised or exited. Any
    other Horovod error propagates unchanged.
    """
    try:
        yield
    except hvd.HorovodInternalError as exc:
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        lowered = text.lower()
        if "mismatched" in lowered:
            raise CollectiveInputError(
                f"{what}: ranks passed different tensors ({text}); pass the same shape and dtype on every rank"
            ) from exc
        if "has been shut down" in lowered:
            raise PeerLostError(
                f"{what}: Horovod shut down while this rank waited in the collective: another rank raised or "
                f"exited (its traceback is in the launcher's log). Horovod said: {first}"
            ) from exc
        if "timed out" in lowered or "timeout" in lowered:
            raise CollectiveTimeoutError(
                f"{what}: Horovod timed out waiting for the other ranks ({first}); raise the timeout with "
                "initialize('horovod', timeout=seconds) or horovodrun --gloo-timeout-seconds"
            ) from exc
        raise
