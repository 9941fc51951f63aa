"""Training helpers: ``auto_model``, ``auto_optim``, ``auto_dataloader`` and their samplers.

The helpers are methods of every context (``ctx.auto_model(model)``) and module functions
(``idist.auto_model(model)``); the logic lives here once, and a backend context only
overrides the hooks ``_wrap_model``, ``_wrap_optimizer``, ``_loader_pin_memory`` and
``_adapt_loader``.
"""

from __future__ import annotations

from ._dataloader import AutoDataLoader
from ._iterable import ShardedIterableDataset
from ._sampler import DistributedProxySampler, ShardSampler

__all__ = ["AutoDataLoader", "DistributedProxySampler", "ShardSampler", "ShardedIterableDataset"]
