"""``XlaContext``: an XLA device (TPU, GPU or CPU through PJRT) and the replica this thread runs.

Every replica runs every collective (a rank outside ``group`` takes part as a bystander and
gets its input back); a tensor's (op, dtype, shape) is agreed across the group before it is
reduced, so a mismatch raises on every rank instead of hanging the device. How each XLA
difference is bridged: docs/xla.md.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, ClassVar, Final, Self, TypeVar, final

import attrs
import torch
from torch import nn

from ... import _codec, _collectives, _exchange
from ..._context import DistContext
from ..._errors import IdistError
from . import _agree, _create, _lib, _loader, _reduce, _training
from ._comm import XlaComm, make_comm
from ._device import XlaDevice

if TYPE_CHECKING:
    from ...training import AutoDataLoader
    from ...training._options import OptimOptions

T = TypeVar("T")
OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)

#: dtypes torch_xla 2.9 does not move to an XLA device bit for bit (see ``_receive_device``)
_INEXACT_ON_DEVICE: Final = (torch.complex128, torch.float16)


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
    def create(cls, name: str, /, *, timeout: float | None = None, **unknown: object) -> Self:
        return _create.create(cls, name, timeout=timeout, **unknown)

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

    def _allreduce_tensor(self, t: torch.Tensor, op: str, comm: XlaComm) -> None:
        # Reducing over one rank is the identity; like a Python value's (which the shared code
        # does not exchange), it runs no program, so its bystanders need not stand by.
        if len(comm.ranks) > 1:
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

    # --------------------------------------------------- agreement, bystanders
    def _checkpoint(
        self, comm: XlaComm, call: str, *, op: str, src: str, value: object, error: IdistError | None
    ) -> None:
        """An all_reduce of a tensor, or one that failed on a rank, first agrees on the tensor's
        (op, dtype, shape) over the group, bystanders too (``_agree``); other calls raise ``error``."""
        if call == "all_reduce" and len(comm.ranks) > 1:
            if error is not None:
                _agree.announce(comm, _codec.encode_error(error))
            elif isinstance(value, torch.Tensor):
                _agree.announce(comm, _codec.reduce_header(op, value))
            return
        super()._checkpoint(comm, call, op=op, src=src, value=value, error=error)

    def _stand_by(self, comm: XlaComm, call: str, src: int, error: IdistError | None) -> None:
        """Run the members' collective with nothing of our own; what comes back is dropped."""
        if len(comm.ranks) == 1:
            return  # a group of one exchanges nothing (see _allreduce_tensor)
        if call == "all_gather":
            _exchange.gather_frames(comm, _codec.encode(None))
        elif call == "broadcast" and error is None and src in comm.ranks:  # else the members raise first
            with contextlib.suppress(IdistError):  # the members raise it; a bystander keeps its value
                _collectives.broadcast(self, comm, None, src)
        elif call == "all_reduce":
            header = _agree.listen(comm)
            if header is not None:
                self._allreduce_tensor(torch.zeros(header.shape, dtype=header.dtype), header.op, comm)

    # ---------------------------------------------------------- training hooks
    def _wrap_model(self, model: nn.Module, sync_bn: bool, kwargs: dict[str, object]) -> nn.Module:
        return _training.wrap_model(self, model, sync_bn, kwargs)

    def _wrap_optimizer(self, optimizer: OptimizerT, kwargs: OptimOptions) -> OptimizerT:
        return _training.wrap_optimizer(self, optimizer, kwargs)

    def _loader_pin_memory(self, requested: bool | None) -> bool:
        return bool(requested)

    def _adapt_loader(self, loader: AutoDataLoader[T]) -> AutoDataLoader[T]:
        return _loader.adapt_loader(self, loader)
