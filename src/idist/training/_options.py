"""The keyword arguments ``auto_model`` forwards, typed: to DDP (``strategy="ddp"``) or to FSDP2.

``Strategy`` names how a model is spread over the ranks: ``"ddp"`` replicates it
(DistributedDataParallel, or the backend's own replication), ``"fsdp"`` shards its
parameters, gradients and optimizer state (``torch.distributed.fsdp.fully_shard``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, TypeAlias, TypedDict

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy
    from torch.distributed.tensor import Shard

Strategy: TypeAlias = Literal["ddp", "fsdp"]
STRATEGIES: tuple[Strategy, ...] = ("ddp", "fsdp")


class DDPOptions(TypedDict, total=False):
    """What ``auto_model`` passes on to ``DistributedDataParallel`` (ignored where there is no DDP).

    ``device_ids`` and ``output_device`` come from the context.
    """

    dim: int
    broadcast_buffers: bool | None
    init_sync: bool
    process_group: ProcessGroup | None
    bucket_cap_mb: float | None
    find_unused_parameters: bool
    check_reduction: bool
    gradient_as_bucket_view: bool
    static_graph: bool
    delay_all_reduce_named_params: list[tuple[str, nn.Parameter]] | None
    param_to_hook_all_reduce: nn.Parameter | None
    mixed_precision: object
    device_mesh: DeviceMesh | None
    skip_all_reduce_unused_params: bool


class FSDPOptions(TypedDict, total=False):
    """What ``auto_model(strategy="fsdp")`` takes: the policy, and options for ``fully_shard``.

    The mesh comes from the context's process group.
    """

    #: shard every submodule of these classes (default: each child of the root holding parameters)
    shard_modules: tuple[type[nn.Module], ...]
    reshard_after_forward: bool | int | None
    shard_placement_fn: Callable[[nn.Parameter], Shard | None] | None
    mp_policy: MixedPrecisionPolicy
    offload_policy: OffloadPolicy
    ignored_params: set[nn.Parameter] | None
