"""Checkpoints that do not depend on the world size or the strategy that saved them.

``ctx.save_checkpoint(path, state)`` / ``ctx.load_checkpoint(path, state)`` (and the module
functions) write and read a torch.distributed.checkpoint (DCP) folder plus the plain values
beside it; ``idist checkpoint info|convert`` inspects one. How it works: docs/sharding.md;
what a checkpoint may contain and what idist trusts: docs/security.md.
"""

from __future__ import annotations

from ._compare import Skipped
from ._load import Loaded

__all__ = ["Loaded", "Skipped"]
