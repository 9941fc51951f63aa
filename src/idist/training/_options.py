"""The keyword arguments the training helpers take, typed: ``auto_model``'s (to DDP or to FSDP2),
``auto_optim``'s (to Horovod) and ``auto_dataloader``'s (to ``DataLoader``, and idist's own).

``Strategy`` names how a model is spread over the ranks: ``"ddp"`` replicates it
(DistributedDataParallel, or the backend's own replication), ``"fsdp"`` shards its
parameters, gradients and optimizer state (``torch.distributed.fsdp.fully_shard``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, SupportsIndex, TypeAlias, TypedDict

if TYPE_CHECKING:
    from multiprocessing.context import BaseContext

    import torch
    from horovod.torch import ProcessSet
    from torch import nn
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy
    from torch.distributed.tensor import Shard
    from torch.utils.data import Sampler

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


class HorovodOptimizerOptions(TypedDict, total=False):
    """``hvd.DistributedOptimizer``'s keyword arguments that ``auto_optim`` passes on as they are."""

    named_parameters: Iterable[tuple[str, nn.Parameter]] | None
    #: a Horovod compressor, such as ``hvd.Compression.fp16``
    compression: object
    backward_passes_per_step: int
    gradient_predivide_factor: float
    num_groups: int
    groups: int | Sequence[Sequence[torch.Tensor]] | None
    sparse_as_dense: bool
    process_set: ProcessSet


class OptimOptions(HorovodOptimizerOptions, total=False):
    """What ``auto_optim`` takes: options for ``hvd.DistributedOptimizer`` on Horovod.

    Serial and torch.distributed log them as ignored; XLA takes none. ``op`` is a Horovod op
    or an idist name.
    """

    op: int | Literal["AVERAGE", "SUM", "ADASUM"]


class DataLoaderOptions(TypedDict, total=False):
    """``torch.utils.data.DataLoader``'s keyword arguments (``auto_dataloader`` sets some itself)."""

    batch_size: int | None
    shuffle: bool | None
    sampler: Sampler[SupportsIndex] | None
    batch_sampler: Iterable[list[Any]] | None  # torch's type: any index type, in lists
    num_workers: int
    collate_fn: Callable[..., object] | None
    pin_memory: bool
    drop_last: bool
    timeout: float
    worker_init_fn: Callable[[int], None] | None
    multiprocessing_context: str | BaseContext | None
    generator: torch.Generator | None
    prefetch_factor: int | None
    persistent_workers: bool
    pin_memory_device: str
    in_order: bool


class AutoDataLoaderOptions(DataLoaderOptions, total=False):
    """What ``auto_dataloader`` takes: ``DataLoader``'s keyword arguments (``batch_size`` is the
    global batch) and idist's own."""

    per_rank_batch_size: int | None
    seed: int | None
    shard_iterable: bool
    even_batches: bool
