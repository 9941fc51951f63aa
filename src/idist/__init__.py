"""idist: one typed, explicit-context API for distributed PyTorch.

Each module-level function is ``current().<method>(...)`` and nothing more; see
``idist.current`` for which context that is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _lazy

if TYPE_CHECKING:
    from ._api import *  # noqa: F403 (one list of imports, in _api; the names load on first use)

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

if not TYPE_CHECKING:  # at run time the names above load on first use, and torch with them
    __getattr__, __dir__ = _lazy.exports(globals(), "._api", __all__)
