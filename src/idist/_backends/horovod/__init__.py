"""Horovod (``horovod.torch``), imported on first selection, never by ``import idist``.

_context   HorovodContext: hooks, ADASUM
_create    factories: hvd.init with dynamic process sets, adoption
_comm      HorovodComm: named ops on one process set; registering process sets
_fold      exact folds and the Adasum emulation for what Horovod lacks
_lib       the lazily imported module, op codes, error mapping
_training  auto_model / auto_optim hooks
"""

from ._context import HorovodContext

__all__ = ["HorovodContext"]
