"""The training methods of every context: auto_model / auto_optim / auto_dataloader, no_sync,
save_checkpoint / load_checkpoint.

Which backends take ``strategy="fsdp"`` and ``no_sync`` is part of the signatures: their
``self`` is typed by the context's comm (native and serial shard; Horovod and XLA do not), so
a type checker rejects the call on a ``HorovodContext``; reached dynamically, the backend's
hook raises ``TrainingSetupError``. The logic lives in ``training/`` and ``checkpoint/``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, TypeVar, cast, overload

from typing_extensions import Unpack

from ._core import CommT_co, ContextCore
from .training import _accumulate, _dataloader, _model, _optim, _settings
from .training._options import AutoDataLoaderOptions, DDPOptions, FSDPOptions, OptimOptions, Strategy

if TYPE_CHECKING:
    from typing import Literal

    from torch import nn
    from torch.nn.parallel import DataParallel, DistributedDataParallel
    from torch.optim import Optimizer
    from torch.utils.data import DataLoader, Dataset

    from ._backends.horovod._comm import HorovodComm
    from ._backends.native._comm import NativeComm
    from ._backends.serial import SelfComm
    from ._backends.xla._comm import XlaComm
    from ._context import DistContext
    from .checkpoint import Loaded
    from .training import AutoDataLoader

T = TypeVar("T")
OptimizerT = TypeVar("OptimizerT", bound="Optimizer")
M = TypeVar("M", bound="nn.Module")
PathArg = str | os.PathLike[str]


class TrainingMethods(ContextCore[CommT_co]):
    """The training and checkpoint methods (``DistContext`` adds the queries and collectives)."""

    @property
    def _context(self) -> DistContext:
        # every context is a DistContext, which derives from this class; the helpers use its collectives
        return cast("DistContext", self)

    # What auto_model returns, by backend: the model itself where it is kept in place (FSDP shards it in
    # place; Horovod and XLA replicate it), else the DDP or DataParallel wrapping it.
    @overload
    def auto_model(
        self: TrainingMethods[NativeComm] | TrainingMethods[SelfComm],
        model: M,
        sync_bn: bool = False,
        *,
        strategy: Literal["fsdp"],
        **kwargs: Unpack[FSDPOptions],
    ) -> M: ...
    @overload
    def auto_model(
        self: TrainingMethods[HorovodComm] | TrainingMethods[XlaComm],
        model: M,
        sync_bn: bool = False,
        *,
        strategy: Literal["ddp"] = "ddp",
        **kwargs: Unpack[DDPOptions],
    ) -> M: ...
    @overload
    def auto_model(
        self: TrainingMethods[SelfComm],
        model: M,
        sync_bn: bool = False,
        *,
        strategy: Literal["ddp"] = "ddp",
        **kwargs: Unpack[DDPOptions],
    ) -> M | DataParallel[M]: ...
    @overload
    def auto_model(
        self, model: M, sync_bn: bool = False, *, strategy: Literal["ddp"] = "ddp", **kwargs: Unpack[DDPOptions]
    ) -> M | DistributedDataParallel | DataParallel[M]: ...
    def auto_model(
        self, model: nn.Module, sync_bn: bool = False, *, strategy: Strategy = "ddp", **kwargs: object
    ) -> nn.Module:
        """The model on this context's device, replicated or sharded over the ranks.

        ``strategy="ddp"`` (the default): DistributedDataParallel on torch.distributed, rank 0's
        weights on Horovod / XLA; ``kwargs`` go to DDP, and ``device_ids`` comes from the context.
        ``strategy="fsdp"`` (torch.distributed and serial only): ``fully_shard`` on each child of
        the root holding parameters (or every submodule of the classes in ``shard_modules=``),
        then on the root, over a mesh of this context's process group; ``kwargs`` go to
        ``fully_shard``. One process keeps the model whole. Never wraps a wrapped model twice.
        ``sync_bn`` converts BatchNorm to SyncBatchNorm (GPU only). The result is typed as what
        this backend returns: keep your own name for ``model`` to reach its attributes.
        """
        return _model.auto_model(self._context, model, sync_bn, strategy, dict(kwargs))

    # XLA's optimizer takes no options; Horovod's DistributedOptimizer does, and serial and
    # torch.distributed log them as ignored, so code written for Horovod runs there too.
    @overload
    def auto_optim(self: TrainingMethods[XlaComm], optimizer: OptimizerT) -> OptimizerT: ...
    @overload
    def auto_optim(
        self: TrainingMethods[NativeComm] | TrainingMethods[SelfComm] | TrainingMethods[HorovodComm],
        optimizer: OptimizerT,
        **kwargs: Unpack[OptimOptions],
    ) -> OptimizerT: ...
    @overload
    def auto_optim(self, optimizer: OptimizerT) -> OptimizerT: ...
    def auto_optim(self, optimizer: OptimizerT, **kwargs: Unpack[OptimOptions]) -> OptimizerT:
        """The optimizer adapted for this backend (unchanged on serial and torch.distributed)."""
        return _optim.auto_optim(self._context, optimizer, **kwargs)

    @overload
    def auto_dataloader(
        self,
        data: Dataset[T] | DataLoader[T],
        /,
        *,
        dataset: None = None,
        dataloader: None = None,
        **kwargs: Unpack[AutoDataLoaderOptions],
    ) -> AutoDataLoader[T]: ...
    @overload
    def auto_dataloader(
        self,
        data: None = None,
        /,
        *,
        dataset: Dataset[T],
        dataloader: None = None,
        **kwargs: Unpack[AutoDataLoaderOptions],
    ) -> AutoDataLoader[T]: ...
    @overload
    def auto_dataloader(
        self,
        data: None = None,
        /,
        *,
        dataset: None = None,
        dataloader: DataLoader[T],
        **kwargs: Unpack[AutoDataLoaderOptions],
    ) -> AutoDataLoader[T]: ...
    def auto_dataloader(
        self,
        data: object = None,
        /,
        *,
        dataset: object = None,
        dataloader: object = None,
        **kwargs: Unpack[AutoDataLoaderOptions],
    ) -> AutoDataLoader[object]:
        """A loader giving this rank its share: ``batch_size`` is the global batch.

        Takes a Dataset (plus DataLoader keyword arguments) or a DataLoader (its settings,
        overridden by ``kwargs``), positionally or as ``dataset=`` (ignite's name) / ``dataloader=``.
        Also ``per_rank_batch_size=``, ``seed=``, ``shard_iterable=``, ``even_batches=``.
        """
        return _dataloader.auto_dataloader(self._context, _settings.the_data(data, dataset, dataloader), **kwargs)

    def no_sync(
        self: TrainingMethods[NativeComm] | TrainingMethods[SelfComm] | TrainingMethods[XlaComm],
        model: nn.Module,
        enabled: bool = True,
    ) -> AbstractContextManager[None]:
        """``with ctx.no_sync(model):`` backward passes in the block keep their gradients local.

        For gradient accumulation: run the first K-1 micro-batches inside, the K-th outside
        (its backward exchanges everything accumulated), then step. DDP and FSDP models skip
        their exchange; on one process and on XLA (whose optimizer step averages) it changes
        nothing. ``enabled=False`` is a plain block. Horovod raises ``TrainingSetupError``:
        pass ``backward_passes_per_step=K`` to ``auto_optim`` there.
        """
        return _accumulate.no_sync(self, model, enabled)

    def save_checkpoint(self, path: PathArg, state: Mapping[str, object]) -> None:
        """Save ``state`` (names -> modules, optimizers, stateful objects, plain values) to the folder ``path``.

        Every rank calls it. Modules (plain, DDP, FSDP) and optimizers are written with
        torch.distributed.checkpoint, each rank its shards, so any world size and strategy can
        load them; plain values (pickled) and ``state_dict()`` of other stateful objects are
        written beside by rank 0. The folder is published by one rename after every rank has
        written: if any rank fails, every rank raises (``CheckpointError``) and the checkpoint
        already at ``path`` stays whole. A save replaces only a checkpoint: anything else at
        ``path`` (the user's files, the working folder), or a path not every rank sees, raises
        ``CheckpointPathError`` before any data is written.
        """
        from .checkpoint import _save  # slow: torch.distributed.checkpoint adds ~1 s to every import

        _save.save(self._context, path, state)

    def load_checkpoint(
        self, path: PathArg, state: Mapping[str, object], *, strict: bool = True, weights_only: bool = True
    ) -> Loaded:
        """Load the checkpoint at ``path`` into ``state``'s modules and optimizers; return its plain values.

        Every rank calls it, and every rank must read the same save (else
        ``CheckpointMismatchError``). Keys and shapes are compared first: with ``strict`` any
        missing or unexpected key or shape that does not fit raises ``CheckpointMismatchError``
        on every rank, listing them, and nothing changes; ``strict=False`` loads what matches
        and lists the rest in the result's ``skipped``. Stateful objects get
        ``load_state_dict``; plain values of a mutable ``state`` are replaced. No checkpoint at
        ``path``: ``CheckpointNotFoundError`` (a ``FileNotFoundError``) on every rank.
        Pickled files admit only common values (``weights_only=True``; anything else raises
        ``CheckpointUnsafeError``); ``weights_only=False`` is only for checkpoints you trust.
        """
        from .checkpoint import _load  # slow: torch.distributed.checkpoint adds ~1 s to every import

        return _load.load(self._context, path, state, strict, weights_only)
