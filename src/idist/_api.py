"""idist's public names, imported together on first use (see ``_lazy``): the ``__init__`` lists them."""

from __future__ import annotations

from ._backends.horovod import HorovodContext as HorovodContext
from ._backends.native import NativeContext as NativeContext
from ._backends.serial import SerialContext as SerialContext
from ._backends.xla import XlaContext as XlaContext
from ._calls import (
    all_gather as all_gather,
    all_gather_tensors_with_shapes as all_gather_tensors_with_shapes,
    all_reduce as all_reduce,
    any_rank_failed as any_rank_failed,
    auto_dataloader as auto_dataloader,
    auto_model as auto_model,
    auto_optim as auto_optim,
    barrier as barrier,
    broadcast as broadcast,
    load_checkpoint as load_checkpoint,
    new_group as new_group,
    no_sync as no_sync,
    one_rank_first as one_rank_first,
    one_rank_only as one_rank_only,
    save_checkpoint as save_checkpoint,
    sync as sync,
    timeout as timeout,
)
from ._context import DistContext as DistContext
from ._errors import (
    AlreadyInitializedError as AlreadyInitializedError,
    BackendUnavailableError as BackendUnavailableError,
    CheckpointError as CheckpointError,
    CheckpointMismatchError as CheckpointMismatchError,
    CheckpointNotFoundError as CheckpointNotFoundError,
    CheckpointPathError as CheckpointPathError,
    CheckpointStateError as CheckpointStateError,
    CheckpointUnsafeError as CheckpointUnsafeError,
    CollectiveInputError as CollectiveInputError,
    CollectiveMismatchError as CollectiveMismatchError,
    CollectiveTimeoutError as CollectiveTimeoutError,
    ContextClosedError as ContextClosedError,
    GroupBrokenError as GroupBrokenError,
    IdistError as IdistError,
    LaunchConfigError as LaunchConfigError,
    LaunchEnvironmentError as LaunchEnvironmentError,
    LaunchError as LaunchError,
    LeaderFailedError as LeaderFailedError,
    PeerLostError as PeerLostError,
    ReduceOverflowError as ReduceOverflowError,
    RendezvousTimeoutError as RendezvousTimeoutError,
    ThreadContextError as ThreadContextError,
    TrainingSetupError as TrainingSetupError,
    UnknownBackendError as UnknownBackendError,
    UnsupportedOpError as UnsupportedOpError,
    UnsupportedSamplerError as UnsupportedSamplerError,
    UnsupportedValueError as UnsupportedValueError,
)
from ._group import Group as Group
from ._setup import (
    available_backends as available_backends,
    backend as backend,
    context as context,
    device as device,
    get_local_rank as get_local_rank,
    get_nnodes as get_nnodes,
    get_node_rank as get_node_rank,
    get_nproc_per_node as get_nproc_per_node,
    get_rank as get_rank,
    get_world_size as get_world_size,
    has_hvd_support as has_hvd_support,
    has_native_dist_support as has_native_dist_support,
    has_xla_support as has_xla_support,
    hostname as hostname,
    initialize as initialize,
    model_name as model_name,
    rank as rank,
    set_local_rank as set_local_rank,
    show_config as show_config,
    world_size as world_size,
)
from ._stack import (
    current as current,
    finalize as finalize,
    use as use,
)
from ._topology import Topology as Topology
from ._types import (
    BackendName as BackendName,
    BoolReduceOp as BoolReduceOp,
    FloatReduceOp as FloatReduceOp,
    GroupArg as GroupArg,
    HorovodBackend as HorovodBackend,
    HorovodReduceOp as HorovodReduceOp,
    IntReduceOp as IntReduceOp,
    ModelName as ModelName,
    NativeBackend as NativeBackend,
    ReduceOp as ReduceOp,
    SerialBackend as SerialBackend,
    XlaBackend as XlaBackend,
)
from .launch import (
    Parallel as Parallel,
    SpawnHandle as SpawnHandle,
    spawn as spawn,
)
from .training import (
    AutoDataLoader as AutoDataLoader,
    DistributedProxySampler as DistributedProxySampler,
)
from .training._options import Strategy as Strategy
