"""Horovod (``horovod.torch``): ``HorovodContext``.

Importing this module does not import horovod: ``create``/``adopt`` load it on first use
and raise ``BackendUnavailableError`` with the install hint when it is missing.

What differs from torch.distributed, and how this module bridges it:

- Horovod's plain ops are out of place; idist uses the in-place ones (``allreduce_``,
  ``broadcast_``) so that ``all_reduce(p.grad)`` changes ``p.grad``. Dtypes Horovod cannot
  reduce (bool, 8/16-bit ints, bfloat16, complex...) go through a staging copy that is
  copied back, so the input is still the result.
- Horovod has no AND/OR: bool tensors use MIN/MAX; integer tensors gather every rank's
  exact bytes and fold them in rank order (the same bits on every rank).
- ADASUM runs natively where Horovod has an Adasum kernel (MPI or GPU builds). A
  gloo-only build has none: the op fails on every rank with "No Adasum operation
  enabled", and from then on this context computes it from the gathered tensors with
  Horovod's formula (pairwise, neighbours first, dot products in float64).
- Groups are Horovod process sets (``hvd.add_process_set``, collective: every rank that
  calls a collective with a new group registers it, members or not). Every op carries an
  explicit name keyed by its process set and a per-set counter: Horovod matches ops by
  name, and its default names count calls per process, which drift apart as soon as
  some ranks run subgroup ops that others do not.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, TypeVar, final, overload

import attrs
import torch
from torch import nn

from .. import _codec, _exchange
from .._context import DistContext, Group
from .._errors import (
    AlreadyInitializedError,
    BackendUnavailableError,
    CollectiveInputError,
    CollectiveTimeoutError,
    PeerLostError,
    UnsupportedOpError,
)
from .._types import COMMON_OPS, GroupArg, HorovodReduceOp

if TYPE_CHECKING:
    import horovod.torch as hvd
    from horovod.torch import ProcessSet

    from .._exchange import Comm
else:
    hvd = None  # the horovod.torch module once _load() ran

TensorT = TypeVar("TensorT", bound=torch.Tensor)
OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)

INSTALL_HINT: Final = (
    "Horovod is not installed in this environment; install it with PyTorch support, e.g. "
    "HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 pip install --no-build-isolation horovod "
    "(or run scripts/horovod/build-wheel.sh and pip install the wheel it prints)"
)

#: dtypes Horovod's allreduce takes as they are
_NATIVE_REDUCE = (torch.int32, torch.int64, torch.float16, torch.float32, torch.float64)
#: dtypes reduced in a wider native dtype, then cast back (integer wrap-around as in torch)
_WIDEN = {
    torch.bool: torch.int32,
    torch.uint8: torch.int64,
    torch.int8: torch.int64,
    torch.int16: torch.int64,
    torch.uint16: torch.int64,
    torch.uint32: torch.int64,
    torch.bfloat16: torch.float32,
}
#: Horovod's Adasum treats vectors whose squared norm is below this as zero
_ADASUM_EPS = 1e-8


def _load() -> None:
    """Import horovod.torch once (it is slow and pulls its C library)."""
    global hvd
    if hvd is not None:
        return
    try:
        import horovod.torch as mod
    except ImportError as exc:
        raise BackendUnavailableError(f"{INSTALL_HINT} ({exc})") from exc
    hvd = mod


def _op_code(op: str) -> int:
    return {
        "SUM": hvd.Sum,
        "AVERAGE": hvd.Average,
        "MIN": hvd.Min,
        "MAX": hvd.Max,
        "PRODUCT": hvd.Product,
        "ADASUM": hvd.Adasum,
    }[op]


def _map_error(exc: Exception, what: str) -> None:
    """Raise Horovod's errors that idist has a type for as that type (from the original).

    "Mismatched ..." comes from Horovod's coordinator on every rank alike; "has been shut
    down" is what a rank blocked in a collective gets when a peer raised or exited.
    """
    text = str(exc).strip()
    if "ismatched" in text:
        raise CollectiveInputError(
            f"{what}: ranks passed different tensors ({text}); pass the same shape and dtype on every rank"
        ) from exc
    if "has been shut down" in text:
        raise PeerLostError(
            f"{what}: Horovod shut down while this rank waited in the collective: another rank raised or "
            f"exited (its traceback is in the launcher's log). Horovod said: {text.splitlines()[0]}"
        ) from exc
    if "imed out" in text or "timeout" in text.lower():
        raise CollectiveTimeoutError(
            f"{what}: Horovod timed out waiting for the other ranks ({text.splitlines()[0]}); "
            "raise the timeout with initialize('horovod', timeout=seconds) or horovodrun --gloo-timeout-seconds"
        ) from exc


@attrs.define(eq=False)
class HorovodComm:
    """Byte and tensor collectives over one Horovod process set."""

    process_set: ProcessSet
    ranks: tuple[int, ...]
    group_rank: int
    slot: int = 64
    sum_by_gather: bool = False
    _seq: int = attrs.field(default=0, alias="_seq")

    def _name(self, kind: str) -> str:
        self._seq += 1
        return f"idist.{kind}.{self.process_set.process_set_id}.{self._seq}"

    def allgather_bytes(self, buf: torch.Tensor) -> torch.Tensor:
        name = self._name("ag")
        try:
            out = hvd.synchronize(hvd.allgather_async(buf, name=name, process_set=self.process_set))
        except hvd.HorovodInternalError as exc:
            _map_error(exc, "all_gather")
            raise
        assert out is not None
        return out

    def broadcast_bytes(self, buf: torch.Tensor, src: int) -> None:
        self.broadcast(buf, src)

    def broadcast(self, t: torch.Tensor, src: int) -> None:
        """In place from group rank ``src``; any dtype (moved as raw bytes)."""
        work = t if t.is_contiguous() else t.contiguous()
        raw = work.reshape(-1).view(torch.uint8)
        name = self._name("bc")
        try:
            hvd.synchronize(hvd.broadcast_async_(raw, self.ranks[src], name=name, process_set=self.process_set))
        except hvd.HorovodInternalError as exc:
            _map_error(exc, "broadcast")
            raise
        if work is not t:
            t.copy_(work)

    def allreduce(self, t: torch.Tensor, op: str) -> None:
        """In place with a native Horovod op; ``t`` must have a dtype in ``_NATIVE_REDUCE``."""
        work = t if t.is_contiguous() else t.contiguous()
        name = self._name("ar")
        try:
            hvd.synchronize(hvd.allreduce_async_(work, name=name, op=_op_code(op), process_set=self.process_set))
        except hvd.HorovodInternalError as exc:
            _map_error(exc, "all_reduce")
            raise
        if work is not t:
            t.copy_(work)

    def broadcast_many(self, tensors: list[torch.Tensor], src: int) -> None:
        """Broadcast several tensors in place from group rank ``src``: all in flight, then wait."""
        pending = []
        for t in tensors:
            work = t if t.is_contiguous() else t.contiguous()
            raw = work.reshape(-1).view(torch.uint8)
            if raw.numel() == 0:
                continue
            name = self._name("bc")
            pending.append(
                (t, work, hvd.broadcast_async_(raw, self.ranks[src], name=name, process_set=self.process_set))
            )
        for t, work, handle in pending:
            try:
                hvd.synchronize(handle)
            except hvd.HorovodInternalError as exc:
                _map_error(exc, "broadcast")
                raise
            if work is not t:
                t.copy_(work)

    def barrier(self) -> None:
        try:
            hvd.barrier(process_set=self.process_set)
        except hvd.HorovodInternalError as exc:
            _map_error(exc, "barrier")
            raise


_FOLDS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "SUM": lambda a, b: a + b,
    "PRODUCT": lambda a, b: a * b,
    "MIN": torch.minimum,
    "MAX": torch.maximum,
    "AND": torch.bitwise_and,
    "OR": torch.bitwise_or,
}


def _fold_tensors(op: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    """Exact rank-order fold for what Horovod cannot reduce natively."""
    dtype = tensors[0].dtype
    if dtype == torch.uint64:
        # torch has few uint64 kernels: fold the same bits as int64; flipping the top bit
        # maps unsigned order onto signed order for MIN/MAX.
        flip = op in ("MIN", "MAX")
        top = torch.tensor(-(2**63), dtype=torch.int64)
        signed = [t.contiguous().view(torch.int64) ^ top if flip else t.contiguous().view(torch.int64) for t in tensors]
        acc = _fold_tensors(op, signed)
        return (acc ^ top if flip else acc).view(torch.uint64)
    if dtype in (torch.uint16, torch.uint32):
        return _fold_tensors(op, [t.to(torch.int64) for t in tensors]).to(dtype)
    acc = tensors[0].clone()
    for t in tensors[1:]:
        acc = _FOLDS[op](acc, t)
    return acc


def adasum_combine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Horovod's pairwise Adasum step: dot products in float64, scaled sum in the dtype."""
    a64, b64 = a.double().reshape(-1), b.double().reshape(-1)
    dot = float(a64 @ b64)
    anormsq, bnormsq = float(a64 @ a64), float(b64 @ b64)
    acoeff = 1.0 - dot / anormsq * 0.5 if anormsq >= _ADASUM_EPS else 1.0
    bcoeff = 1.0 - dot / bnormsq * 0.5 if bnormsq >= _ADASUM_EPS else 1.0
    return a * acoeff + b * bcoeff


def adasum_tree(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Combine a power-of-two list pairwise, neighbours first, as Horovod's tree does."""
    level = list(tensors)
    while len(level) > 1:
        level = [adasum_combine(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


@final
@attrs.frozen(eq=False, kw_only=True)
class HorovodContext(DistContext):
    """An initialized Horovod runtime (``horovod.torch``) and its topology."""

    MODEL_NAME = "horovod-dist"
    VALID_OPS = (*COMMON_OPS, "ADASUM")

    _world: HorovodComm = attrs.field(repr=False, alias="_world")
    #: True when this context called hvd.init() and must call hvd.shutdown() on close
    _owns_init: bool = attrs.field(repr=False, default=False, alias="_owns_init")
    #: device types on which Horovod said it has no Adasum kernel (mutable cache)
    _no_native_adasum: dict[str, bool] = attrs.field(repr=False, factory=dict, alias="_no_native_adasum")

    # ----------------------------------------------------------- backend hooks
    def _world_comm(self) -> HorovodComm:
        return self._world

    def _make_comm(self, ranks: tuple[int, ...]) -> HorovodComm | None:
        # Registering a process set is collective: members and non-members all call it.
        ps = _register_process_set(ranks)
        if self.rank not in ranks:
            return None
        return HorovodComm(ps, ranks, ranks.index(self.rank))

    def _native_group_comm(self, group: object) -> HorovodComm | None:
        if not isinstance(group, hvd.ProcessSet):
            return super()._native_group_comm(group)  # type: ignore[return-value]
        if group.process_set_id is None or group.ranks is None:
            raise CollectiveInputError(
                f"{group} is not registered with Horovod; pass it to hvd.add_process_set() "
                "(or hvd.init(process_sets=[...])) first, or pass a list of ranks as group="
            )
        key = (-1, group.process_set_id)
        comms = self._state.comms
        if key not in comms:
            ranks = tuple(group.ranks)
            comms[key] = HorovodComm(group, ranks, ranks.index(self.rank)) if self.rank in ranks else None
        return comms[key]  # type: ignore[return-value]

    def _allreduce_tensor(self, t: torch.Tensor, op: str, comm: Comm) -> None:
        assert isinstance(comm, HorovodComm)
        dtype = t.dtype
        if t.device.type != "cpu" and not hvd.cuda_built():
            work = t.cpu()
            self._allreduce_tensor(work, op, comm)
            t.copy_(work)
        elif dtype in _NATIVE_REDUCE and op not in ("AND", "OR"):
            comm.allreduce(t, op)
        elif dtype == torch.bool:
            work = t.to(torch.int32)
            comm.allreduce(work, {"AND": "MIN", "OR": "MAX"}.get(op, op))
            t.copy_(work)
        elif dtype in _WIDEN and op not in ("AND", "OR"):
            work = t.to(_WIDEN[dtype])
            comm.allreduce(work, op)
            t.copy_(work)
        elif dtype.is_complex:
            work = torch.view_as_real(t.contiguous())
            comm.allreduce(work, op)
            t.copy_(torch.view_as_complex(work))
        elif dtype == torch.uint64 and op in ("SUM", "PRODUCT"):
            # Same bits modulo 2**64 as unsigned arithmetic.
            work = t.contiguous().view(torch.int64)
            comm.allreduce(work, op)
            t.copy_(work.view(torch.uint64))
        else:
            t.copy_(_fold_tensors(op, self._gather_same_shape(t, comm, op)))

    def _gather_same_shape(self, t: torch.Tensor, comm: HorovodComm, op: str) -> list[torch.Tensor]:
        """Every rank's exact tensor, checked for the same shape and dtype on every rank."""
        frames = _exchange.gather_frames(comm, _codec.encode_tensor(t))
        values = _exchange.decode_all(comm, frames, "all_reduce")
        kinds = {
            r: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else type(v).__name__
            for r, v in zip(comm.ranks, values, strict=True)
        }
        if len(set(kinds.values())) > 1:
            raise CollectiveInputError(
                f"all_reduce({op}) needs the same tensor shape and dtype on every rank, got {kinds}"
            )
        return [v.to(t.device) for v in values if isinstance(v, torch.Tensor)]

    def _broadcast_tensor(self, t: torch.Tensor, src: int, comm: Comm) -> None:
        assert isinstance(comm, HorovodComm)
        if t.device.type != "cpu" and not hvd.cuda_built():
            work = t.cpu()
            comm.broadcast(work, src)
            t.copy_(work)
        else:
            comm.broadcast(t, src)

    def _barrier(self, comm: Comm) -> None:
        assert isinstance(comm, HorovodComm)
        comm.barrier()

    def _close(self) -> None:
        self._state.comms.clear()
        if self._owns_init and hvd.is_initialized():
            hvd.shutdown()

    # --------------------------------------------------------- training hooks
    def _wrap_model(self, model: nn.Module, sync_bn: bool, kwargs: dict[str, Any]) -> nn.Module:
        from ._horovod_training import wrap_model

        return wrap_model(self, model, sync_bn, kwargs)

    def _wrap_optimizer(self, optimizer: OptimizerT, kwargs: dict[str, Any]) -> OptimizerT:
        from ._horovod_training import wrap_optimizer

        return wrap_optimizer(self, optimizer, kwargs)

    # ------------------------------------------------------------- collectives
    @overload
    def all_reduce(self, x: TensorT, op: HorovodReduceOp = "SUM", group: GroupArg = None) -> TensorT: ...
    @overload
    def all_reduce(self, x: bool, op: HorovodReduceOp = "SUM", group: GroupArg = None) -> bool: ...
    @overload
    def all_reduce(self, x: int, op: HorovodReduceOp = "SUM", group: GroupArg = None) -> int: ...
    @overload
    def all_reduce(self, x: float, op: HorovodReduceOp = "SUM", group: GroupArg = None) -> float: ...
    def all_reduce(self, x: object, op: HorovodReduceOp = "SUM", group: GroupArg = None) -> object:
        """As ``DistContext.all_reduce``, plus ``op="ADASUM"`` for floating-point tensors."""
        if op == "ADASUM":
            return self._adasum(x, group)
        return super().all_reduce(x, op, group)  # type: ignore[call-overload]

    def _group_ranks(self, group: object) -> tuple[int, ...]:
        if isinstance(group, Group):
            return group.ranks
        if isinstance(group, hvd.ProcessSet):
            return tuple(group.ranks or ())
        return self._check_ranks(group)

    def _adasum(self, x: object, group: GroupArg) -> object:
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
            what = f"{x.dtype} tensors" if isinstance(x, torch.Tensor) else type(x).__name__
            raise UnsupportedOpError(
                f"op 'ADASUM' is not valid for {what}; it combines floating-point tensors (gradients). "
                "Use SUM or AVERAGE here"
            )
        if group is not None and self._group_ranks(group) != tuple(range(self.world_size)):
            # decided on every rank alike, members or not
            raise UnsupportedOpError("op 'ADASUM' works on all ranks only (Horovod has no Adasum for process sets)")
        self._check_open()
        n = self.world_size
        if n & (n - 1):
            raise UnsupportedOpError(f"op 'ADASUM' needs a power-of-two number of ranks, this world has {n}")
        if self._no_native_adasum.get(x.device.type) is None:
            try:
                self._world.allreduce(x, "ADASUM")
                return x
            except hvd.HorovodInternalError as exc:
                # raised on every rank alike, so every rank switches to the emulation
                if "No Adasum operation" not in str(exc):
                    raise
                self._no_native_adasum[x.device.type] = True
        x.copy_(adasum_tree(self._gather_same_shape(x, self._world, "ADASUM")))
        return x


# ------------------------------------------------------------------ helpers
def _register_process_set(ranks: tuple[int, ...]) -> ProcessSet:
    try:
        return hvd.add_process_set(list(ranks))
    except ValueError as exc:
        text = str(exc)
        if "duplicate" in text:
            existing = _existing_process_set(ranks)
            if existing is not None:
                return existing
        raise CollectiveInputError(
            f"cannot create the Horovod process set {list(ranks)}: {text.strip()}. Initialize Horovod with "
            "hvd.init(process_sets='dynamic') (idist.initialize('horovod') does), or register the set "
            "yourself and pass the hvd.ProcessSet as group="
        ) from exc


def _existing_process_set(ranks: tuple[int, ...]) -> ProcessSet | None:
    """The registered process set with exactly these ranks (one someone else added)."""
    from horovod.common import process_sets as ps_mod  # private API: horovod keeps no public lookup

    try:
        ids: dict[int, list[int]] = ps_mod._basics._get_process_set_ids_and_ranks()
    except (AttributeError, ValueError):
        return None
    for ps_id, members in ids.items():
        if tuple(members) == ranks:
            found: ProcessSet = ps_mod._temp_process_set_object(ps_id)
            found.ranks = list(members)
            return found
    return None


@contextmanager
def _env_set(values: dict[str, str]) -> Iterator[None]:
    """Set variables for the block only (hvd.init reads them once, at init)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _build(owns_init: bool, launcher: str) -> HorovodContext:
    rank, size = hvd.rank(), hvd.size()
    local_rank = hvd.local_rank()
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    config = {
        "launcher": launcher,
        "rank": f"hvd.rank()={rank}",
        "world_size": f"hvd.size()={size}",
        "controller": "mpi" if hvd.mpi_enabled() else "gloo",
    }
    world = HorovodComm(hvd.global_process_set, tuple(range(size)), rank)
    ctx = HorovodContext(
        backend="horovod", rank=rank, world_size=size, local_rank=local_rank,
        nproc_per_node=hvd.local_size(), node_rank=hvd.cross_rank(), nnodes=hvd.cross_size(),
        device=device, config=config, _world=world, _owns_init=owns_init,
    )  # fmt: skip
    if device.type == "cuda":
        previous = torch.cuda.current_device()
        torch.cuda.set_device(device)
        ctx._state.on_close.append(lambda: torch.cuda.set_device(previous))
    return ctx


# ----------------------------------------------------------------- factories
def is_available(name: str) -> bool:
    try:
        _load()
    except BackendUnavailableError:
        return False
    return True


def create(name: str, *, timeout: float | None = None, **unknown: Any) -> HorovodContext:
    """Initialize Horovod (``hvd.init`` with dynamic process sets) and wrap it.

    Topology comes from Horovod's launcher (horovodrun / horovod.run); without one it is
    a world of one. ``timeout`` (seconds) sets Horovod's gloo timeout. Raises
    ``BackendUnavailableError`` (horovod missing) or ``AlreadyInitializedError``
    (Horovod already initialized: ``idist.current()`` adopts it).
    """
    if unknown:
        raise TypeError(f"unknown options for backend {name!r}: {', '.join(sorted(unknown))}")
    _load()
    if hvd.is_initialized():
        raise AlreadyInitializedError(
            "Horovod is already initialized; idist.current() adopts it, or call hvd.shutdown() first"
        )
    env = {"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}
    if timeout is not None:
        env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(max(1, round(float(timeout))))
    with _env_set(env):
        hvd.init()
    launcher = "horovodrun" if "HOROVOD_RANK" in os.environ else "none"
    try:
        return _build(owns_init=True, launcher=launcher)
    except BaseException:
        hvd.shutdown()
        raise


def adopt() -> HorovodContext | None:
    """Wrap a Horovod runtime the user initialized (never shut down by us)."""
    if "horovod.torch" not in sys.modules:
        return None
    _load()
    if not hvd.is_initialized():
        return None
    return _build(owns_init=False, launcher="adopted horovod")


def still_adopted(ctx: DistContext) -> bool:
    return isinstance(ctx, HorovodContext) and hvd is not None and hvd.is_initialized()
