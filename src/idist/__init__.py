"""idist: one typed, explicit-context API for distributed PyTorch.

Each module-level function is ``current().<method>(...)`` and nothing more; see
``idist.current`` for which context that is.
"""

from __future__ import annotations

from ._backends.horovod import HorovodContext
from ._backends.native import NativeContext
from ._backends.serial import SerialContext
from ._backends.xla import XlaContext

# the module-level functions, one thin shim each over current()
from ._calls import (
    all_gather,
    all_gather_tensors_with_shapes,
    all_reduce,
    any_rank_failed,
    auto_dataloader,
    auto_model,
    auto_optim,
    barrier,
    broadcast,
    load_checkpoint,
    new_group,
    no_sync,
    one_rank_first,
    one_rank_only,
    save_checkpoint,
    sync,
    timeout,
)
from ._context import DistContext
from ._errors import (
    AlreadyInitializedError,
    BackendUnavailableError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointPathError,
    CheckpointStateError,
    CheckpointUnsafeError,
    CollectiveInputError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    ContextClosedError,
    GroupBrokenError,
    IdistError,
    LaunchConfigError,
    LaunchEnvironmentError,
    LaunchError,
    LeaderFailedError,
    PeerLostError,
    ReduceOverflowError,
    RendezvousTimeoutError,
    ThreadContextError,
    TrainingSetupError,
    UnknownBackendError,
    UnsupportedOpError,
    UnsupportedSamplerError,
    UnsupportedValueError,
)
from ._group import Group
from ._setup import (
    available_backends,
    backend,
    context,
    device,
    get_local_rank,
    get_nnodes,
    get_node_rank,
    get_nproc_per_node,
    get_rank,
    get_world_size,
    has_hvd_support,
    has_native_dist_support,
    has_xla_support,
    hostname,
    initialize,
    model_name,
    rank,
    set_local_rank,
    show_config,
    world_size,
)
from ._stack import current, finalize, use
from ._topology import Topology
from ._types import (
    BackendName,
    BoolReduceOp,
    FloatReduceOp,
    GroupArg,
    HorovodBackend,
    HorovodReduceOp,
    IntReduceOp,
    ModelName,
    NativeBackend,
    ReduceOp,
    SerialBackend,
    XlaBackend,
)
from .launch import Parallel, SpawnHandle, spawn
from .training import AutoDataLoader, DistributedProxySampler
from .training._options import Strategy

__version__ = "0.1.0"

__all__ = [
    # contexts
    "DistContext", "HorovodContext", "NativeContext", "SerialContext", "XlaContext",
    "Group", "Topology",
    # setup and the context stack
    "available_backends", "context", "current", "finalize", "has_hvd_support",
    "has_native_dist_support", "has_xla_support", "initialize", "set_local_rank", "show_config", "use",
    # queries
    "backend", "device", "get_local_rank", "get_nnodes", "get_node_rank", "get_nproc_per_node",
    "get_rank", "get_world_size", "hostname", "model_name", "rank", "world_size",
    # collectives
    "all_gather", "all_gather_tensors_with_shapes", "all_reduce", "any_rank_failed", "barrier", "broadcast",
    "new_group", "sync", "timeout",
    # rank-only and training helpers, checkpoints
    "AutoDataLoader", "DistributedProxySampler", "auto_dataloader", "auto_model", "auto_optim", "no_sync",
    "one_rank_first", "one_rank_only", "load_checkpoint", "save_checkpoint",
    # launching
    "Parallel", "SpawnHandle", "spawn",
    # errors
    "AlreadyInitializedError", "BackendUnavailableError", "CheckpointError", "CheckpointMismatchError",
    "CheckpointNotFoundError", "CheckpointPathError", "CheckpointStateError", "CheckpointUnsafeError",
    "CollectiveInputError",
    "CollectiveMismatchError", "CollectiveTimeoutError", "ContextClosedError", "GroupBrokenError", "IdistError",
    "LaunchConfigError", "LaunchEnvironmentError", "LaunchError", "LeaderFailedError", "PeerLostError",
    "ReduceOverflowError", "RendezvousTimeoutError", "ThreadContextError", "TrainingSetupError",
    "UnknownBackendError", "UnsupportedOpError", "UnsupportedSamplerError", "UnsupportedValueError",
    # type aliases
    "BackendName", "BoolReduceOp", "FloatReduceOp", "GroupArg", "HorovodBackend", "HorovodReduceOp",
    "IntReduceOp", "ModelName", "NativeBackend", "ReduceOp", "SerialBackend", "Strategy", "XlaBackend",
]  # fmt: skip
