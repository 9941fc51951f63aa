"""torch.distributed (gloo, nccl, mpi): the context, its comm, checked mode, DDP wrapping.

_context, _create, _adopt   NativeContext and its factories; _comm: collectives on a ProcessGroup
_guard, _verdict            checked mode, failures judged into verdicts, section timeouts
_tally, _keys               arrivals counted with add (join, stall reports); keys in the store
_liveness, _board, _pulse   who stopped answering: a node's shared board, one beat per node,
                            the monitor and the lost-ranks record; _stuck: torch's own waits
_inflight, _reaper          tensors gloo still holds (clean exit); freeing groups still in use
_ddp, _fsdp                 auto_model's DistributedDataParallel and fully_shard
"""

from ._context import NativeContext

__all__ = ["NativeContext"]
