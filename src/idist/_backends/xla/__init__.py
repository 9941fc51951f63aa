"""PyTorch/XLA (``torch_xla`` >= 2.7, PJRT), imported on first selection, never by ``import idist``.

_context   XlaContext: hooks, bystanders, agreeing tensors before reducing them
_create    factories: the calling thread's replica, adoption
_device    XlaDevice: running programs now, in rank order on the multi-thread CPU device
_comm      XlaComm: byte collectives every replica runs
_reduce    tensor all_reduce / broadcast: exact bits, emulated ops
_lib       the lazily imported modules
_training  auto_model / auto_optim hooks
_loader    auto_dataloader: batches on the device, counted as the model takes them
"""

from ._context import XlaContext

__all__ = ["XlaContext"]
