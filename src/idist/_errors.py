"""The exceptions idist raises: one tree under ``IdistError`` (drawn in its docstring).

Every class also subclasses the builtin that existing ``except`` clauses already catch
(``ValueError``, ``ImportError``, ``TimeoutError``...). A collective's input error is agreed
across ranks: the rank whose input was bad ships its message inside the collective, so
every rank raises the same class with the same text.
"""

from __future__ import annotations

import pickle

__all__ = [
    "AlreadyInitializedError",
    "BackendUnavailableError",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointPathError",
    "CheckpointStateError",
    "CheckpointUnsafeError",
    "CollectiveInputError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "ContextClosedError",
    "GroupBrokenError",
    "LeaderFailedError",
    "PeerLostError",
    "IdistError",
    "LaunchEnvironmentError",
    "LaunchConfigError",
    "LaunchError",
    "ReduceOverflowError",
    "RendezvousTimeoutError",
    "ThreadContextError",
    "TrainingSetupError",
    "UnknownBackendError",
    "UnsupportedOpError",
    "UnsupportedSamplerError",
    "UnsupportedValueError",
]


class IdistError(Exception):
    """Base class of every error raised by idist itself::

    IdistError
    ├── UnknownBackendError          (ValueError)   backend name not known
    ├── BackendUnavailableError      (ImportError, ValueError) backend known, not installed / no device
    ├── UnsupportedOpError           (ValueError)   reduce op not valid for this backend/dtype
    ├── CollectiveInputError         (ValueError)   bad src, bad group, mismatched dtypes
    │   └── UnsupportedValueError    (TypeError)    a value type the codec cannot move
    ├── ReduceOverflowError          (OverflowError) Python int result outside int64
    ├── LaunchEnvironmentError       (RuntimeError) partial or contradictory launcher variables
    ├── AlreadyInitializedError      (RuntimeError) initialize() twice
    ├── LaunchError                  (RuntimeError) a spawned rank failed, or a launch could not start
    │   └── LaunchConfigError        (ValueError)   spawn / Parallel / CLI arguments that cannot work
    ├── ContextClosedError           (RuntimeError) a context used after finalize()/its block
    ├── ThreadContextError           (RuntimeError) a thread that belongs to no simulated rank, during a run
    ├── CollectiveTimeoutError       (TimeoutError) a collective did not complete in time (names the missing ranks)
    ├── RendezvousTimeoutError       (TimeoutError) ranks (nodes) that did not join the rendezvous in time
    ├── PeerLostError                (ConnectionError) a peer died, closed its connection or went silent mid-collective
    │   └── GroupBrokenError         (ConnectionError) the group is unusable: one rank failed, or a collective
    ├── LeaderFailedError            (RuntimeError) the leader of one_rank_first / one_rank_only raised
    └── TrainingSetupError           (ValueError)   auto_model / auto_optim / auto_dataloader options that cannot work
        └── UnsupportedSamplerError  (TypeError)    a sampler that cannot be shared out between ranks
    (CollectiveMismatchError, a CollectiveInputError: ranks called different collectives, checked mode)
    """


class UnknownBackendError(IdistError, ValueError):
    """The backend name is not one idist knows."""


class BackendUnavailableError(IdistError, ImportError, ValueError):
    """The backend is known but cannot run here (package missing, no device)."""


class UnsupportedOpError(IdistError, ValueError):
    """The reduce op is unknown, or not valid for this backend or data type."""


class CollectiveInputError(IdistError, ValueError):
    """A collective got input it cannot use on some rank (bad src, group, dtype...)."""


class UnsupportedValueError(CollectiveInputError, TypeError):
    """A value whose type the collective cannot move or reduce."""


class ReduceOverflowError(IdistError, OverflowError):
    """A Python int reduction left the int64 range."""


class LaunchEnvironmentError(IdistError, RuntimeError):
    """Launcher environment variables are partial or contradict each other."""


class LaunchError(IdistError, RuntimeError):
    """A launch failed: a rank raised, exited non-zero or was killed, or could not start.

    ``rank`` (global), ``local_rank``, ``exitcode`` (negative: the signal number, as in
    ``multiprocessing``), ``signal_name`` and ``traceback`` (the rank's own, as text) are
    set when one rank is to blame; they are None when the launch itself failed.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        local_rank: int | None = None,
        exitcode: int | None = None,
        signal_name: str | None = None,
        traceback: str | None = None,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.local_rank = local_rank
        self.exitcode = exitcode
        self.signal_name = signal_name
        self.traceback = traceback

    def __reduce__(self) -> tuple[object, ...]:
        fields = (self.rank, self.local_rank, self.exitcode, self.signal_name, self.traceback)
        return (_rebuild_launch_error, (type(self), str(self), *fields))


class LaunchConfigError(LaunchError, ValueError):
    """Launch arguments that cannot work (nprocs < 1, node_rank outside nnodes...)."""


def _rebuild_launch_error(
    cls: type[LaunchError],
    message: str,
    rank: int | None,
    local_rank: int | None,
    exitcode: int | None,
    signal_name: str | None,
    traceback: str | None,
) -> LaunchError:
    return cls(
        message, rank=rank, local_rank=local_rank, exitcode=exitcode, signal_name=signal_name, traceback=traceback
    )


class AlreadyInitializedError(IdistError, RuntimeError):
    """``initialize()`` was called while a process default context exists."""


class ContextClosedError(IdistError, RuntimeError):
    """A context was used after it was finalized."""


class ThreadContextError(IdistError, RuntimeError):
    """idist was called, during a simulated run, from a thread that no simulated rank started.

    Its rank cannot be known (``idist.testing``: threads inherit the rank that starts them).
    """


class CollectiveMismatchError(CollectiveInputError):
    """Ranks called different collectives (checked mode): the message has a per-rank table."""


class CollectiveTimeoutError(IdistError, TimeoutError):
    """A collective did not complete within its timeout; names the ranks that did not arrive."""


class RendezvousTimeoutError(IdistError, TimeoutError):
    """Not every rank joined the rendezvous in time; names the missing ranks and their nodes."""


class PeerLostError(IdistError, ConnectionError):
    """A peer died, closed its connection or stopped answering (liveness) in the middle of a collective."""


class GroupBrokenError(PeerLostError):
    """The group cannot be used any more: a rank failed on its own, or a collective failed.

    Raised by every later call on every rank, and by the peers of a rank whose input was bad
    where they could not have agreed on it; the message names the rank and its error.
    """


class LeaderFailedError(IdistError, RuntimeError):
    """The leading rank of ``one_rank_first`` / ``one_rank_only`` raised; followers get this."""


class TrainingSetupError(IdistError, ValueError):
    """``auto_model`` / ``auto_optim`` / ``auto_dataloader`` got options that cannot work."""


class UnsupportedSamplerError(TrainingSetupError, TypeError):
    """A sampler that cannot be shared out between ranks (not a Sampler, already distributed, no len)."""


class CheckpointError(IdistError, RuntimeError):
    """A checkpoint save or load failed on some rank; raised on every rank, naming the ranks.

    A failed save leaves what was at the path as it was; a failed load changes nothing, or
    says in its message what it changed (docs/sharding.md).
    """


class CheckpointStateError(CheckpointError, ValueError):
    """The state cannot be saved or loaded as given (an optimizer without its model, a value pickle refuses)."""


class CheckpointMismatchError(CheckpointError, ValueError):
    """The state and the checkpoint differ (missing or unexpected keys, shapes that do not fit: all listed),
    or the ranks read different checkpoints (which rank read which save)."""


class CheckpointPathError(CheckpointError, OSError):
    """A checkpoint path that not every rank can see or write (node-local disks in a multi-node job)."""


class CheckpointNotFoundError(CheckpointPathError, FileNotFoundError):
    """No checkpoint at the path (on the ranks named)."""


class CheckpointUnsafeError(CheckpointError, pickle.UnpicklingError):
    """A checkpoint file names code to run on loading (a global outside the safe list): refused, named.

    Raised before the state changes; ``load_checkpoint(path, state, weights_only=False)``
    loads it, for checkpoints you trust.
    """


# Codes used to ship an error class from one rank to the others (see _codec).
ERROR_CODES: dict[int, type[IdistError]] = {
    1: CollectiveInputError,
    2: UnsupportedValueError,
    3: ReduceOverflowError,
    4: UnsupportedOpError,
}
CODE_OF: dict[type[IdistError], int] = {cls: code for code, cls in ERROR_CODES.items()}
