"""What simulated ranks share, because they are threads of one process, and how a run gives it back.

``ProcessState.capture()`` before a run and ``restore()`` after it put back what any rank may
have changed: torch's default dtype, its CPU (and CUDA) generators, Python's ``random`` and
numpy's global generator, ``os.environ``, the working directory, the warning filters and
``showwarning``, torch's deterministic-algorithms flag and thread count, and torch.distributed's
default group (destroyed if a rank created one). During the run the ranks share all of it:
docs/testing.md lists what that means and when to use ``ProcessWorld`` instead.
"""

from __future__ import annotations

import os
import random
import sys
import warnings
from collections.abc import Callable
from typing import Any

import attrs
import torch
import torch.distributed as dist

_cuda_initialized: Callable[[], bool] = torch.cuda.is_initialized
#: what ``catch_warnings`` swaps besides the filters (private names of the warnings module)
_IMPL, _MUTATED = "_showwarnmsg_impl", "_filters_mutated"


@attrs.frozen
class ProcessState:
    """A snapshot of the process-wide state a run may change (see the module docstring)."""

    dtype: torch.dtype
    torch_rng: torch.Tensor
    cuda_rng: list[torch.Tensor] | None
    py_rng: tuple[Any, ...]
    np_rng: object
    environ: dict[str, str]
    cwd: str | None
    filters: list[Any]
    showwarning: Any
    showwarnmsg_impl: Any
    deterministic: tuple[bool, bool]
    threads: int
    dist_initialized: bool

    @classmethod
    def capture(cls) -> ProcessState:
        np = sys.modules.get("numpy")
        return cls(
            dtype=torch.get_default_dtype(),
            torch_rng=torch.get_rng_state(),
            cuda_rng=torch.cuda.get_rng_state_all() if _cuda_initialized() else None,
            py_rng=random.getstate(),
            np_rng=np.random.get_state() if np is not None else None,
            environ=dict(os.environ),
            cwd=_cwd(),
            filters=list(warnings.filters),
            showwarning=warnings.showwarning,
            showwarnmsg_impl=getattr(warnings, _IMPL),
            deterministic=(
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            ),
            threads=torch.get_num_threads(),
            dist_initialized=dist.is_available() and dist.is_initialized(),
        )

    def restore(self) -> None:
        """Put the process back as captured (the environment key by key: no other variable is touched)."""
        torch.set_default_dtype(self.dtype)
        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        random.setstate(self.py_rng)
        np = sys.modules.get("numpy")
        if np is not None and self.np_rng is not None:
            np.random.set_state(self.np_rng)
        self._restore_environ()
        if self.cwd is not None and _cwd() != self.cwd:
            os.chdir(self.cwd)
        if warnings.filters != self.filters:
            warnings.filters = list(self.filters)  # as catch_warnings does: a new list
            getattr(warnings, _MUTATED)()
        warnings.showwarning = self.showwarning
        setattr(warnings, _IMPL, self.showwarnmsg_impl)
        if (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) != (
            self.deterministic
        ):
            torch.use_deterministic_algorithms(self.deterministic[0], warn_only=self.deterministic[1])
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        if not self.dist_initialized and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()  # a rank initialized torch.distributed itself

    def _restore_environ(self) -> None:
        now = os.environ
        for key in [k for k in now if k not in self.environ]:
            del now[key]
        for key, value in self.environ.items():
            if now.get(key) != value:
                now[key] = value


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # the folder was removed: nothing to go back to
        return None
