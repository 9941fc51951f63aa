"""What every runner shares: its settings, how jobs and results travel, the rank's job loop.

A job is a pickled ``(fn, args)``; a rank runs it as ``fn(ctx, *args)`` and replies with a
pickled ``(ok, value)``. Tensors travel as dtype, shape and raw bytes: torch's own pickling
fails for some dtypes (uint16/32/64 in torch 2.13) and would share memory through
/dev/shm. An exception that cannot be pickled back travels as a ``RemoteError``.
"""

from __future__ import annotations

import ctypes
import io
import math
import pickle
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any, ClassVar, NoReturn, Self

import torch

from .. import _stack
from .._context import DistContext
from .._errors import IdistError, LaunchConfigError
from .._exit import exit_now


class RemoteError(IdistError, RuntimeError):
    """A rank's exception that could not be pickled back: its type name, message and traceback."""


def _tensor_from(dtype: torch.dtype, shape: tuple[int, ...], data: bytes) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: object) -> Any:
        if type(obj) is torch.Tensor:
            flat = obj.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
            data = ctypes.string_at(flat.data_ptr(), flat.numel()) if flat.numel() else b""
            return _tensor_from, (obj.dtype, tuple(obj.shape), data)
        return NotImplemented


def dumps(obj: object) -> bytes:
    """``obj`` pickled, tensors as raw bytes (see the module docstring)."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def pack(ok: bool, value: object) -> bytes:
    """A rank's reply: ``(ok, value)``, or ``(False, RemoteError)`` when it does not pickle.

    An exception is also unpickled here first: one that pickles but cannot be rebuilt (an
    ``__init__`` with other arguments than its ``args``) travels as a ``RemoteError`` with its
    type, message and traceback, which the parent could not recover from the bytes.
    """
    try:
        raw = dumps((ok, value))
        if not ok:
            pickle.loads(raw)
        return raw
    except Exception as exc:
        if ok:
            value = exc
        text = "".join(traceback.format_exception(value)) if isinstance(value, BaseException) else repr(value)
        return dumps((False, RemoteError(text)))


def run_job(ctx: DistContext, job: bytes, where: str) -> bytes:
    """Run one pickled job on ``ctx``; the reply, with the rank's traceback as a note on failure."""
    try:
        fn, args = pickle.loads(job)
        return pack(True, fn(ctx, *args))
    except BaseException as exc:
        exc.__traceback__ = exc.__traceback__.tb_next if exc.__traceback__ else None
        exc.add_note(f"--- traceback on {where} ---\n{''.join(traceback.format_exception(exc))}")
        return pack(False, exc)


#: a message that is not a job: break the group, saying why (the rest of the message)
BREAK = b"\x00idist-break\x00"


def serve(ctx: DistContext, where: str, recv: Callable[[], bytes], send: Callable[[bytes], None]) -> None:
    """Run jobs from ``recv`` and ``send`` the replies until an empty job (or the parent went away).

    ``BREAK`` + a reason breaks this rank's group (peers waiting for it in a collective raise
    ``GroupBrokenError`` naming the reason) and sends nothing back.
    """
    try:
        while job := recv():
            if job.startswith(BREAK):
                breaker = getattr(ctx, "_break", None)  # a backend whose groups can be broken
                if breaker is not None:
                    breaker(job[len(BREAK) :].decode("utf-8", "replace"))
                continue
            send(run_job(ctx, job, where))
    except (EOFError, OSError):
        pass  # the parent went away


def serve_and_exit(ctx: DistContext, where: str, recv: Callable[[], bytes], send: Callable[[bytes], None]) -> NoReturn:
    """``serve``, then finalize the process default context and end this process at once.

    The interpreter's teardown of torch takes seconds on a loaded machine, and the group is
    finalized by then: nothing else is worth waiting for.
    """
    try:
        serve(ctx, where, recv, send)
    finally:
        _stack.finalize()
        exit_now(0)


class BaseWorld:
    """A runner's settings: ``world_size`` ranks, ``timeout`` seconds per run, checked mode."""

    #: the runner's name in test ids: ``<KIND>@<world_size>``
    KIND: ClassVar[str]

    def __init__(self, world_size: int, *, timeout: float, checked: bool = True) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise LaunchConfigError(f"world_size must be an int >= 1, got {world_size!r}")
        try:
            seconds = float(timeout)
        except (TypeError, ValueError):
            seconds = math.nan
        if not seconds > 0:
            raise ValueError(f"timeout must be a positive number of seconds (math.inf: no limit), got {timeout!r}")
        self.world_size = world_size
        self.timeout = seconds
        #: checked mode (on by default here: tests should catch ranks that call different collectives)
        self.checked = bool(checked)

    @property
    def name(self) -> str:
        return f"{self.KIND}@{self.world_size}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(world_size={self.world_size}, timeout={self.timeout:g})"

    def close(self) -> None:
        """Release the world (threads, processes). Safe to call twice."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
