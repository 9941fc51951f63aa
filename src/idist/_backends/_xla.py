"""PyTorch/XLA (``torch_xla`` >= 2.7, PJRT runtime): ``XlaContext``.

Importing this module does not import torch_xla (its import alone takes seconds):
``create``/``adopt`` load it on first use and raise ``BackendUnavailableError`` with the
install hint when it is missing. Topology comes from ``torch_xla.runtime`` (world size,
global and local ordinal of the calling thread); the collectives are ``xm.all_reduce`` and
``xm.all_gather`` on the context's XLA device.

How XLA differs from torch.distributed, and how this module bridges it:

- **Every replica runs every collective.** An XLA collective is one program that all
  replicas execute; a replica that skips it leaves the others waiting. So a rank outside
  ``group`` still takes part (as a *bystander*: its own singleton replica group, or a
  zero contribution) and then returns its input unchanged, as the contract says. All
  ranks must therefore call a group collective, members or not (as with ``xm`` itself).
- **Shapes and dtypes are agreed first.** Ranks that reduce different shapes would build
  different programs and hang, so ``all_reduce`` of a tensor first gathers each rank's
  (op, dtype, shape) through the byte exchange and raises on every rank when they differ.
- **Exact bits.** Broadcast moves the tensor's bits as same-width integers (src adds its
  bits, everyone else adds zeros): no float32 staging, ``-0.0`` and NaN payloads survive,
  and the caller's tensor on src is never zeroed (ignite's ``collective_broadcast``-style
  multiply-by-zero turns a receiver's inf/NaN into NaN and zeroes nothing it should keep).
  Bytes (str, bytes, pickled objects, frames) move as uint8 tensors the same way.
- **Ops XLA lacks are emulated.** ``AND``/``OR`` on integer tensors gather the exact values
  and fold them in rank order; ``AVERAGE`` is ``SUM`` then a division; ``MIN``/``MAX``
  propagate NaN as torch does (XLA's drop it), via a second reduction of the NaN mask in
  the same program. On the XLA *CPU* device, bfloat16 reductions run in float32 (the CPU
  runtime has no bf16 all-reduce) and are rounded back: exact for MIN/MAX, rounded once
  for SUM/PRODUCT/AVERAGE.
- **One process, several device threads (CPU).** ``CPU_NUM_DEVICES=N`` gives one process N
  XLA CPU devices, one thread each (``xmp.spawn``/``idist.testing``). XLA's CPU runtime
  matches a collective across threads by the *compiled module's id*, so every thread must
  run the same executable (pytorch/xla#9089: compiled twice, they wait forever for each
  other). In that mode each collective is compiled by the ranks in turn (rank order,
  through torch_xla's compilation cache, so rank 0 compiles and the others reuse it),
  its input is materialized first (so no rank-dependent constant leaks into the program),
  and it runs at once. ``sync()`` steps the graph the same way.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar, final, overload

import attrs
import torch
from torch import nn

from .. import _codec, _exchange
from .._context import DistContext
from .._errors import (
    BackendUnavailableError,
    CollectiveInputError,
    CollectiveTimeoutError,
    IdistError,
)
from .._reduce import check_op_name, check_tensor_op
from .._types import GroupArg, ReduceOp

if TYPE_CHECKING:
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    from ..training._dataloader import AutoDataLoader
else:
    torch_xla = xm = xr = None  # the modules, once _load() ran

#: torch_xla's C extension (``torch_xla._XLAC``, which torch_xla does not export)
_C: Any = None

T = TypeVar("T")
TensorT = TypeVar("TensorT", bound=torch.Tensor)
OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)

INSTALL_HINT: Final = (
    "torch_xla is not installed in this environment; install the torch_xla release that matches your torch "
    "(e.g. pip install torch==2.9.0 torch_xla==2.9.0, add [tpu] on a TPU VM) and set PJRT_DEVICE "
    "(TPU, CUDA or CPU); scripts/xla/setup-venv.sh builds such an environment in .venv-xla"
)

#: idist op -> xm reduce type (AVERAGE is SUM then a division; integer AND/OR are folded)
_XM_OPS: Final = {
    "SUM": "sum", "AVERAGE": "sum", "PRODUCT": "mul", "MIN": "min", "MAX": "max", "AND": "and", "OR": "or",
}  # fmt: skip
#: same-width integer dtype for moving a dtype's bits exactly
_BITS: Final = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
#: dtypes torch_xla 2.9 does not move to an XLA device bit for bit (see ``_receive_device``)
_INEXACT_ON_DEVICE: Final = (torch.complex128, torch.float16)
#: how long a device thread waits for its turn to compile before giving up (seconds)
DEFAULT_TURN_TIMEOUT = 300.0
#: prefix of the frame an all_reduce of a tensor ships first: "<op>|<dtype code>|<shape>"
_META: Final = "\x00idist-xla-all_reduce\x00"


def _load() -> None:
    """Import torch_xla once (slow: it loads the XLA runtime library)."""
    global torch_xla, xm, xr, _C
    if xm is not None:
        return
    try:
        import torch_xla as txla
        import torch_xla.core.xla_model as xla_model
        import torch_xla.runtime as runtime
    except (ImportError, OSError) as exc:
        raise BackendUnavailableError(f"{INSTALL_HINT} ({type(exc).__name__}: {exc})") from exc
    torch_xla, xm, xr = txla, xla_model, runtime
    _C = importlib.import_module("_XLAC")


# ------------------------------------------------------------------ turnstile
@attrs.define(eq=False)
class _Turnstile:
    """Lets the device threads of one process compile a collective in rank order."""

    size: int
    turn: int = 0
    cond: threading.Condition = attrs.Factory(threading.Condition)

    def run(self, index: int, fn: Callable[[], None], timeout: float) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.turn == index, timeout):
                raise CollectiveTimeoutError(
                    f"XLA device thread {index} waited {timeout:.0f}s for rank {self.turn} to reach the same "
                    "collective; every rank must call the same collectives in the same order"
                )
            try:
                fn()
            finally:
                self.turn = (index + 1) % self.size
                self.cond.notify_all()


_TURNSTILES: dict[int, _Turnstile] = {}
_TURNSTILES_LOCK = threading.Lock()


def _turnstile(size: int) -> _Turnstile:
    with _TURNSTILES_LOCK:
        ts = _TURNSTILES.get(size)
        if ts is None:
            ts = _TURNSTILES[size] = _Turnstile(size)
        return ts


# ----------------------------------------------------------------------- comm
@attrs.define(eq=False)
class XlaComm:
    """Byte and tensor collectives for one group, run by every replica of the world.

    ``group_rank`` is -1 on a bystander (a rank outside the group): it takes part in every
    XLA program the members run and discards what it gets.
    """

    ctx: XlaContext = attrs.field(repr=False)
    ranks: tuple[int, ...]
    group_rank: int
    #: xm replica groups: None for the world, else the group plus every other rank alone
    replica_groups: list[list[int]] | None
    slot: int = 64
    sum_by_gather: bool = False

    @property
    def bystander(self) -> bool:
        return self.group_rank < 0

    def allgather_bytes(self, buf: torch.Tensor) -> torch.Tensor:
        ctx = self.ctx
        n = buf.numel()
        dev = ctx._prepare(buf)
        out = ctx._materialize([xm.all_gather(dev, pin_layout=False)])[0]
        if self.replica_groups is None:
            return out
        return torch.cat([out[r * n : (r + 1) * n] for r in self.ranks])

    def broadcast_bytes(self, buf: torch.Tensor, src: int) -> None:
        # World-wide SUM: bystanders receive src's bytes too, so they take the same rounds.
        mine = buf if self.group_rank == src else torch.zeros_like(buf)
        buf.copy_(self.ctx._world_sum([mine])[0])


def _replica_groups(ranks: tuple[int, ...], world_size: int) -> list[list[int]] | None:
    if len(ranks) == world_size:
        return None
    return [list(ranks)] + [[r] for r in range(world_size) if r not in ranks]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory as same-width integers (a CPU tensor)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.complex128:
        return torch.view_as_real(t).view(torch.int64)
    return t.view(_BITS[t.element_size()])


def _nan_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, math.nan)


@final
@attrs.frozen(eq=False, kw_only=True)
class XlaContext(DistContext):
    """An XLA device (TPU, GPU or CPU through PJRT) and the replica this thread runs."""

    MODEL_NAME = "xla-dist"

    #: the runtime's device type: "TPU", "CUDA", "CPU"...
    device_type: str
    #: seconds a device thread waits for its turn (ordered mode) before raising
    turn_timeout: float = attrs.field(repr=False, default=DEFAULT_TURN_TIMEOUT)
    #: True when device threads of this process must compile collectives in turn (CPU)
    _ordered: bool = attrs.field(repr=False, default=False, alias="_ordered")
    _world: XlaComm = attrs.field(repr=False, default=None, alias="_world")

    # ----------------------------------------------------------- device work
    def _prepare(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on this context's device; in ordered mode its pending graph is run first."""
        dev = t if t.device == self.device else t.to(self.device)
        if self._ordered and dev is t:
            # Its own graph has no collective, so any thread may compile it as it likes;
            # afterwards the collective's program only sees device data.
            _C._xla_sync_multi([dev], devices=[], wait=False)
        return dev

    def _launch(self, tensors: list[torch.Tensor]) -> None:
        """Compile and start the pending programs computing ``tensors``."""
        if self._ordered:
            _turnstile(self.world_size).run(
                self.rank,
                lambda: _C._xla_sync_multi(tensors, devices=[], wait=False),
                self.turn_timeout,
            )
        else:
            _C._xla_sync_multi(tensors, devices=[], wait=False)
        # Every xm collective chains the device's all-reduce token; syncing ``tensors`` runs
        # the collective but leaves the token pending on it, so the next collective's program
        # would contain (and run again) every collective since the last torch_xla.sync(): a
        # new, ever larger program each call, never a compilation-cache hit. The collective
        # has run now, so start the next chain afresh, as torch_xla.sync() does.
        _C._set_all_reduce_token(str(self.device), None)

    def _materialize(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run the programs computing ``tensors`` now; their values on the CPU."""
        self._launch(tensors)
        return [t.cpu() for t in tensors]

    def _world_sum(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Element-wise SUM over every replica of the world (CPU results)."""
        reduced: list[torch.Tensor] = []
        for t in tensors:
            out = xm.all_reduce("sum", self._prepare(t))
            assert isinstance(out, torch.Tensor)
            reduced.append(out)
        return self._materialize(reduced)

    # ----------------------------------------------------------- backend hooks
    def _world_comm(self) -> XlaComm:
        return self._world

    def _make_comm(self, ranks: tuple[int, ...]) -> XlaComm:
        grank = ranks.index(self.rank) if self.rank in ranks else -1
        return XlaComm(self, ranks, grank, _replica_groups(ranks, self.world_size))

    def _comm(self, group: GroupArg) -> XlaComm:
        comm = super()._comm(group)
        assert isinstance(comm, XlaComm)
        return comm

    def _allreduce_tensor(self, t: torch.Tensor, op: str, comm: Any) -> None:
        """Reduce ``t`` (agreed on every rank) in place; a bystander's result is dropped."""
        assert isinstance(comm, XlaComm)
        dtype = t.dtype
        if t.numel() == 0:
            return  # agreed on every rank: nothing to reduce (XLA rejects empty gathers)
        if dtype.is_complex:
            # SUM/AVERAGE (the complex ops) act on the real and imaginary parts alike, and a
            # real view keeps complex128 exact (torch_xla drops its imaginary part on device).
            real = torch.view_as_real(t.detach().cpu().resolve_conj().contiguous())
            self._allreduce_tensor(real, op, comm)
            if not comm.bystander:
                t.copy_(torch.view_as_complex(real))
            return
        if t.dim() == 0 and t.device != self.device:
            # torch_xla moves a 0-dim tensor as a scalar, which it may share with an equal
            # constant of the program (or fold into one): the ranks' programs then differ and
            # never meet. A 1-element vector (a view of t) moves as plain data.
            self._allreduce_tensor(t.reshape(1), op, comm)
            return
        groups = comm.replica_groups
        if op in ("AND", "OR") and dtype != torch.bool:
            result = self._fold_integers(t, op, comm)
        else:
            src = self._prepare(t)
            stage = torch.float32 if dtype == torch.bfloat16 and self.device_type == "CPU" else dtype
            work = src.to(stage) if stage != dtype else src
            reduced = xm.all_reduce(_XM_OPS[op], work, groups=groups)
            assert isinstance(reduced, torch.Tensor)
            nan: torch.Tensor | None = None
            if op in ("MIN", "MAX") and (dtype.is_floating_point or dtype.is_complex):
                got = xm.all_reduce("max", torch.isnan(work).to(torch.uint8), groups=groups)
                assert isinstance(got, torch.Tensor)
                nan = got
            if self._ordered:
                # Finish on the CPU: a constant in the collective's program (the NaN, the
                # divisor) is device data torch_xla may share with an equal input value on
                # some ranks only, which again makes the ranks' programs differ.
                outs = self._materialize([reduced] if nan is None else [reduced, nan])
                if comm.bystander:
                    return
                value = outs[0] if nan is None else torch.where(outs[1].bool(), _nan_like(outs[0]), outs[0])
                if op == "AVERAGE":
                    value = value / len(comm.ranks)
                t.copy_(value.to(dtype))
                return
            if nan is not None:
                reduced = torch.where(nan.bool(), _nan_like(reduced), reduced)
            if op == "AVERAGE":
                reduced = reduced / len(comm.ranks)
            result = reduced.to(dtype) if reduced.dtype != dtype else reduced
        if comm.bystander:
            self._materialize([result])
            return
        if t.device == self.device and not self._ordered:
            t.copy_(result)  # stays lazy: runs with the rest of the step
            return
        t.copy_(self._materialize([result])[0])

    def _fold_integers(self, t: torch.Tensor, op: str, comm: XlaComm) -> torch.Tensor:
        """Bitwise AND/OR (which XLA's all-reduce lacks): gather, then fold in rank order."""
        flat = self._prepare(t).reshape(-1)  # t is not a 0-dim CPU tensor here (see _allreduce_tensor)
        gathered: torch.Tensor = xm.all_gather(flat, pin_layout=False)
        n = flat.numel()
        parts = [gathered[r * n : (r + 1) * n] for r in comm.ranks]
        acc: torch.Tensor = parts[0]
        for part in parts[1:]:
            acc = torch.bitwise_and(acc, part) if op == "AND" else torch.bitwise_or(acc, part)
        return acc.reshape(t.shape)

    def _broadcast_tensor(self, t: torch.Tensor, src: int, comm: Any) -> None:
        assert isinstance(comm, XlaComm)
        bits = _bits(t)
        mine = bits if comm.group_rank == src else torch.zeros_like(bits)
        got = self._world_sum([mine])[0]
        if comm.group_rank != src and not comm.bystander:
            value = torch.view_as_complex(got.view(torch.float64)) if t.dtype == torch.complex128 else got.view(t.dtype)
            t.copy_(value.reshape(t.shape))

    def _receive_device(self, dtype: torch.dtype) -> torch.device:
        # torch_xla 2.9 moves these inexactly to an XLA device (complex128 loses its
        # imaginary part, float16 its NaN payloads): a receiver gets src's exact bits on the CPU.
        return torch.device("cpu") if dtype in _INEXACT_ON_DEVICE else self.device

    def _barrier(self, comm: Any) -> None:
        self._world_sum([torch.zeros(1, dtype=torch.int32)])

    def _sync_device(self) -> None:
        self.step()
        xm.wait_device_ops([str(d) for d in _C._xla_real_devices([str(self.device)])])

    def _close(self) -> None:
        self._state.comms.clear()

    # ------------------------------------------------------------ XLA specific
    def step(self) -> None:
        """Cut the lazy graph here and start it (``torch_xla.sync()``), in turn when ordered.

        ``sync()`` does this, then waits for the device and the other ranks.
        """
        self._check_open()
        if self._ordered:
            _turnstile(self.world_size).run(self.rank, torch_xla.sync, self.turn_timeout)
        else:
            torch_xla.sync()

    # ------------------------------------------------------------- collectives
    @overload
    def all_reduce(self, x: TensorT, op: ReduceOp = "SUM", group: GroupArg = None) -> TensorT: ...
    @overload
    def all_reduce(self, x: bool, op: ReduceOp = "SUM", group: GroupArg = None) -> bool: ...
    @overload
    def all_reduce(self, x: int, op: ReduceOp = "SUM", group: GroupArg = None) -> int: ...
    @overload
    def all_reduce(self, x: float, op: ReduceOp = "SUM", group: GroupArg = None) -> float: ...
    def all_reduce(self, x: object, op: ReduceOp = "SUM", group: GroupArg = None) -> object:
        """As ``DistContext.all_reduce``; every rank calls it, members of ``group`` or not.

        A tensor's (op, dtype, shape) is agreed across the group first: a mismatch raises
        ``CollectiveInputError`` on every rank instead of hanging the device.
        """
        name = check_op_name(op, self.VALID_OPS, self.backend)
        comm = self._comm(group)
        if comm.bystander:
            if len(comm.ranks) > 1:  # a group of one runs no collective (see below): nothing to join
                self._stand_by_reduce(comm)
            return x
        if not isinstance(x, torch.Tensor):
            return super().all_reduce(x, op, group)  # type: ignore[call-overload]
        if len(comm.ranks) == 1:
            # Reducing one tensor is the identity; like a Python value (the shared code skips
            # the exchange for a group of one), it runs no collective, and neither do the
            # bystanders, who cannot tell a tensor from a value here.
            check_tensor_op(name, x.dtype)
            return x
        try:
            check_tensor_op(name, x.dtype)
            frame = _codec.encode(f"{_META}{name}|{_codec.DTYPE_CODE[x.dtype]}|{list(x.shape)}")
        except IdistError as exc:
            frame = _codec.encode_error(exc)
        metas = _exchange.decode_all(comm, _exchange.gather_frames(comm, frame), "all_reduce")
        if len(set(metas)) > 1:
            seen = {r: str(m).removeprefix(_META) for r, m in zip(comm.ranks, metas, strict=True)}
            raise CollectiveInputError(
                f"all_reduce needs the same op, dtype and shape on every rank of the group, got "
                f"(op|dtype code|shape) {seen}; pass matching tensors"
            )
        self._allreduce_tensor(x, name, comm)
        return x

    def _stand_by_reduce(self, comm: XlaComm) -> None:
        """Take part in the members' all_reduce (scalar or tensor) without a value of our own."""
        bufs = _exchange.gather_frames(comm, _codec.encode(None))
        first = _codec.decode(bufs[0])
        if not (isinstance(first, str) and first.startswith(_META)):
            return  # Python values (or an error): the byte exchange was all of it
        if any(isinstance(_codec.decode(b), IdistError) for b in bufs):
            return
        if len({_codec.as_bytes(b[: _codec.frame_length(b)]) for b in bufs}) > 1:
            return  # the members raise; they run nothing more
        name, code, shape = first.removeprefix(_META).split("|")
        dims = [int(d) for d in shape.strip("[]").split(",") if d.strip()]
        self._allreduce_tensor(torch.zeros(dims, dtype=_codec.DTYPES[int(code)]), name, comm)

    @overload
    def all_gather(self, x: torch.Tensor, group: GroupArg = None) -> list[torch.Tensor]: ...
    @overload
    def all_gather(self, x: T, group: GroupArg = None) -> list[T]: ...
    def all_gather(self, x: object, group: GroupArg = None) -> list[Any]:
        """As ``DistContext.all_gather``; a rank outside ``group`` takes part and gets ``[x]``."""
        comm = self._comm(group)
        if comm.bystander:
            if len(comm.ranks) > 1:  # the member of a group of one exchanges nothing
                _exchange.gather_frames(comm, _codec.encode(None))
            return [x]
        return super().all_gather(x, group)

    def broadcast(self, x: T | None, src: int = 0, group: GroupArg = None, *, safe_mode: bool = False) -> T:
        """As ``DistContext.broadcast``; a rank outside ``group`` takes part and gets ``x`` back."""
        comm = self._comm(group)
        if not comm.bystander:
            return super().broadcast(x, src, group, safe_mode=safe_mode)
        try:
            super().broadcast(None, src, group)
        except IdistError:
            pass  # the members raise it; a bystander keeps its value
        return x  # type: ignore[return-value]

    # ---------------------------------------------------------- training hooks
    def _wrap_model(self, model: nn.Module, sync_bn: bool, kwargs: dict[str, Any]) -> nn.Module:
        from ._xla_training import wrap_model

        return wrap_model(self, model, sync_bn, kwargs)

    def _wrap_optimizer(self, optimizer: OptimizerT, kwargs: dict[str, Any]) -> OptimizerT:
        from ._xla_training import wrap_optimizer

        return wrap_optimizer(self, optimizer, kwargs)

    def _loader_pin_memory(self, requested: bool | None) -> bool:
        return bool(requested)

    def _adapt_loader(self, loader: AutoDataLoader[T]) -> AutoDataLoader[T]:
        from ._xla_training import adapt_loader

        return adapt_loader(self, loader)


# ----------------------------------------------------------------- factories
def is_available(name: str) -> bool:
    """Whether torch_xla can be imported here (checked without importing it)."""
    try:
        return importlib.util.find_spec("torch_xla") is not None
    except (ImportError, ValueError):
        return False


def _build(launcher: str, timeout: float) -> XlaContext:
    device = torch_xla.device()
    rank, size = xr.global_ordinal(), xr.world_size()
    local_rank = xr.local_ordinal()
    device_type = str(xr.device_type())
    per_node = max(1, xr.local_device_count()) if size > 1 else 1
    ordered = device_type == "CPU" and xr.addressable_device_count() > 1 and size > 1
    config = {
        "launcher": launcher,
        "rank": f"torch_xla.runtime.global_ordinal()={rank}",
        "world_size": f"torch_xla.runtime.world_size()={size}",
        "device": f"{device} ({device_type}, PJRT_DEVICE={os.environ.get('PJRT_DEVICE', '')})",
    }
    if ordered:
        config["collectives"] = "compiled in rank order (several XLA CPU device threads in one process)"
    ctx = XlaContext(
        backend="xla-tpu", rank=rank, world_size=size, local_rank=local_rank,
        nproc_per_node=per_node, node_rank=rank // per_node, nnodes=max(1, size // per_node),
        device=device, config=config, device_type=device_type, turn_timeout=timeout, _ordered=ordered,
    )  # fmt: skip
    world = XlaComm(ctx, tuple(range(size)), rank, None)
    object.__setattr__(ctx, "_world", world)
    return ctx


def create(name: str, *, timeout: float | None = None, **unknown: Any) -> XlaContext:
    """The XLA device of the calling thread and its replica (``torch_xla.runtime``).

    Run it inside each replica (``xmp.spawn``/``torch_xla.launch``, ``idist.spawn(...,
    backend="xla-tpu")``, or once in a single-device process). ``timeout`` (seconds)
    bounds the wait for peers' turns in the multi-thread CPU mode. Raises
    ``BackendUnavailableError`` when torch_xla is missing or cannot load.
    """
    if unknown:
        raise TypeError(f"unknown options for backend {name!r}: {', '.join(sorted(unknown))}")
    _load()
    return _build("torch_xla runtime", float(timeout) if timeout is not None else DEFAULT_TURN_TIMEOUT)


def adopt() -> XlaContext | None:
    """A context for an XLA replica the user started (xmp.spawn), once its runtime is up."""
    if "torch_xla" not in sys.modules:
        return None
    _load()
    if not _C._xla_runtime_is_initialized() or xr.world_size() < 2:
        return None
    return _build("adopted torch_xla replica", DEFAULT_TURN_TIMEOUT)


def still_adopted(ctx: DistContext) -> bool:
    """Whether ``ctx`` is the calling thread's replica (each device thread has its own)."""
    return isinstance(ctx, XlaContext) and xr is not None and xr.global_ordinal() == ctx.rank
