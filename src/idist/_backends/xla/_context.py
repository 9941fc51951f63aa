"""``XlaContext``: an XLA device (TPU, GPU or CPU through PJRT) and the replica this thread runs.

Every replica runs every collective (a rank outside ``group`` takes part as a bystander and
gets its input back); a tensor's (op, dtype, shape) is agreed across the group before it is
reduced, so a mismatch raises on every rank instead of hanging the device. How each XLA
difference is bridged: docs/xla.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Final, Self, TypeVar, final

import attrs
import torch
from torch import nn

from ... import _codec, _collectives, _exchange, _frame
from ..._context import DistContext
from ..._errors import CollectiveInputError, IdistError
from ..._reduce import check_op_name, check_tensor_op
from ..._types import GroupArg
from . import _create, _lib, _reduce, _training
from ._comm import XlaComm, make_comm
from ._device import XlaDevice

if TYPE_CHECKING:
    from ...training import AutoDataLoader

T = TypeVar("T")
OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)

#: dtypes torch_xla 2.9 does not move to an XLA device bit for bit (see ``_receive_device``)
_INEXACT_ON_DEVICE: Final = (torch.complex128, torch.float16)
#: prefix of the frame an all_reduce of a tensor ships first: "<op>|<dtype code>|<shape>"
_META: Final = "\x00idist-xla-all_reduce\x00"


@final
@attrs.frozen(eq=False, kw_only=True)
class XlaContext(DistContext[XlaComm]):
    """An XLA device (TPU, GPU or CPU through PJRT) and the replica this thread runs."""

    MODEL_NAME = "xla-dist"
    INSTALL_HINT: ClassVar[str | None] = _lib.INSTALL_HINT
    ADOPTS_FROM: ClassVar[str | None] = "torch_xla"

    #: the runtime's device type: "TPU", "CUDA", "CPU"...
    device_type: str

    # ------------------------------------------------------------- factories
    @classmethod
    def create(cls, name: str, /, **options: Any) -> Self:
        return _create.create(cls, name, **options)

    @classmethod
    def is_available(cls, name: str) -> bool:
        return _lib.installed()

    @classmethod
    def adopt(cls) -> Self | None:
        return _create.adopt(cls)

    def still_adopted(self) -> bool:
        """Whether this is the calling thread's replica (each device thread has its own)."""
        return _lib.xr is not None and _lib.xr.global_ordinal() == self.rank

    # ------------------------------------------------------------ XLA specific
    @property
    def xla(self) -> XlaDevice:
        """This replica's device and how its programs run (ordered mode, turn timeout)."""
        return self._state.world.device

    @property
    def turn_timeout(self) -> float:
        """Seconds a device thread waits for its turn (ordered mode) before raising."""
        return self.xla.turn_timeout

    def step(self) -> None:
        """Cut the lazy graph here and start it (``torch_xla.sync()``), in turn when ordered.

        ``sync()`` does this, then waits for the device and the other ranks.
        """
        self._check_open()
        self.xla.in_turn(_lib.torch_xla.sync)

    # ----------------------------------------------------------- backend hooks
    def _make_comm(self, ranks: tuple[int, ...]) -> XlaComm:
        return make_comm(self.xla, ranks)

    def _xla_comm(self, group: GroupArg) -> XlaComm:
        comm = self._comm(group)
        assert comm is not None  # every replica has a comm for every group (bystanders too)
        return comm

    def _allreduce_tensor(self, t: torch.Tensor, op: str, comm: XlaComm) -> None:
        _reduce.allreduce_tensor(t, op, comm, self.device_type)

    def _broadcast_tensor(self, t: torch.Tensor, src: int, comm: XlaComm) -> None:
        _reduce.broadcast_tensor(t, src, comm)

    def _receive_device(self, dtype: torch.dtype) -> torch.device:
        # torch_xla 2.9 moves these inexactly to an XLA device (complex128 loses its
        # imaginary part, float16 its NaN payloads): a receiver gets src's exact bits on the CPU.
        return torch.device("cpu") if dtype in _INEXACT_ON_DEVICE else self.device

    def _barrier(self, comm: XlaComm) -> None:
        self.xla.world_sum([torch.zeros(1, dtype=torch.int32)])

    def _sync_device(self) -> None:
        self.step()
        _lib.xm.wait_device_ops([str(d) for d in _lib.C._xla_real_devices([str(self.device)])])

    def _close(self) -> None:
        self._state.comms.clear()

    # ------------------------------------------------------------- collectives
    def _all_reduce(self, x: object, op: str, group: GroupArg) -> object:
        """Every rank calls it, members of ``group`` or not; a tensor's (op, dtype, shape) is agreed first."""
        name = check_op_name(op, self.VALID_OPS, self.backend)
        comm = self._xla_comm(group)
        if comm.bystander:
            if len(comm.ranks) > 1:  # a group of one runs no collective (see below): nothing to join
                self._stand_by_reduce(comm)
            return x
        if not isinstance(x, torch.Tensor):
            return _collectives.all_reduce(self, comm, x, name)
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
        if len({_frame.as_bytes(b[: _frame.frame_length(b)]) for b in bufs}) > 1:
            return  # the members raise; they run nothing more
        name, code, shape = first.removeprefix(_META).split("|")
        dims = [int(d) for d in shape.strip("[]").split(",") if d.strip()]
        self._allreduce_tensor(torch.zeros(dims, dtype=_codec.DTYPES[int(code)]), name, comm)

    def _all_gather(self, x: object, group: GroupArg) -> list[Any]:
        """A rank outside ``group`` takes part and gets ``[x]``."""
        comm = self._xla_comm(group)
        if comm.bystander:
            if len(comm.ranks) > 1:  # the member of a group of one exchanges nothing
                _exchange.gather_frames(comm, _codec.encode(None))
            return [x]
        return super()._all_gather(x, group)

    def _broadcast(self, x: object, src: int, group: GroupArg) -> object:
        """A rank outside ``group`` takes part and gets ``x`` back."""
        comm = self._xla_comm(group)
        if not comm.bystander:
            return super()._broadcast(x, src, group)
        try:
            super()._broadcast(None, src, group)
        except IdistError:
            pass  # the members raise it; a bystander keeps its value
        return x

    # ---------------------------------------------------------- training hooks
    def _wrap_model(self, model: nn.Module, sync_bn: bool, kwargs: dict[str, Any]) -> nn.Module:
        return _training.wrap_model(self, model, sync_bn, kwargs)

    def _wrap_optimizer(self, optimizer: OptimizerT, kwargs: dict[str, Any]) -> OptimizerT:
        return _training.wrap_optimizer(self, optimizer, kwargs)

    def _loader_pin_memory(self, requested: bool | None) -> bool:
        return bool(requested)

    def _adapt_loader(self, loader: AutoDataLoader[T]) -> AutoDataLoader[T]:
        return _training.adapt_loader(self, loader)
