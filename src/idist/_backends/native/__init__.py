"""torch.distributed (gloo, nccl, mpi): the context, its comm, checked mode, DDP wrapping.

_context   NativeContext: hooks over one ProcessGroup
_create    factories: arguments/launcher environment, adoption, in-process (simulated)
_comm      NativeComm: byte and tensor collectives on a ProcessGroup
_guard     checked mode, stall reports, section timeouts
_inflight  tensors gloo's worker threads still hold (clean interpreter exit)
_ddp       auto_model's DistributedDataParallel
"""

from ._context import NativeContext

__all__ = ["NativeContext"]
