"""torch_xla, imported on first selection (its import alone takes seconds)."""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Final

from ..._errors import BackendUnavailableError

__all__ = ["C", "INSTALL_HINT", "installed", "load", "torch_xla", "xm", "xr"]

if TYPE_CHECKING:
    from types import ModuleType

    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    #: torch_xla's C extension (``torch_xla._XLAC``, which torch_xla does not export or type)
    C: ModuleType
else:
    torch_xla = xm = xr = C = None  # the modules, once load() ran

INSTALL_HINT: Final = (
    "torch_xla is not installed in this environment; install the torch_xla release that matches your torch "
    "(e.g. pip install torch==2.9.0 torch_xla==2.9.0, add [tpu] on a TPU VM) and set PJRT_DEVICE "
    "(TPU, CUDA or CPU); scripts/xla/setup-venv.sh builds such an environment in .venv-xla"
)


def installed() -> bool:
    """Whether torch_xla can be imported here (checked without importing it)."""
    try:
        return importlib.util.find_spec("torch_xla") is not None
    except (ImportError, ValueError):
        return False


def load() -> None:
    """Import torch_xla once (slow: it loads the XLA runtime library)."""
    global torch_xla, xm, xr, C
    if xm is not None:
        return
    try:
        import torch_xla as txla  # optional: imported on selection only
        import torch_xla.core.xla_model as xla_model  # (see above)
        import torch_xla.runtime as runtime  # (see above)
    except (ImportError, OSError) as exc:
        raise BackendUnavailableError(f"{INSTALL_HINT} ({type(exc).__name__}: {exc})") from exc
    torch_xla, xm, xr = txla, xla_model, runtime
    C = importlib.import_module("_XLAC")
