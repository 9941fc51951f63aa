"""torch.distributed (gloo, nccl, mpi): the context, its comm, checked mode, DDP wrapping.

_context   NativeContext: hooks over one ProcessGroup
_create    factories: arguments/launcher environment, adoption, in-process (simulated)
_comm      NativeComm: byte and tensor collectives on a ProcessGroup, its failure path
_guard     checked mode, failure verdicts, stall reports, section timeouts
_verdict   Verdict (a failure judged), bounded store calls
_liveness  heartbeats on the store and the watcher that finds silent peers
_inflight  tensors gloo's worker threads still hold (clean interpreter exit)
_reaper    freeing groups a collective still uses
_ddp       auto_model's DistributedDataParallel
"""

from ._context import NativeContext

__all__ = ["NativeContext"]
