"""Reading and writing the tensor state with torch.distributed.checkpoint (DCP).

Over a torch process group, DCP plans the files together: each rank writes its own shards
(replicated tensors once) and reads what its tensors need, resharding as it goes. Without
one (serial, Horovod, XLA, simulated ranks: the model is replicated), rank 0 writes the
whole state alone and every rank reads it whole.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import save

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.checkpoint.metadata import Metadata

    from ._state import TensorState

#: catch_warnings changes process-wide filters: one single-process DCP call at a time
_QUIET = threading.Lock()


@contextmanager
def _single_process() -> Iterator[None]:
    # DCP warns on every call without a process group that it assumes one process: that is the intent
    with _QUIET, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def write(state: dict[str, TensorState], folder: Path, group: ProcessGroup | None, lead: bool) -> None:
    """Write ``state`` into ``folder``: together over ``group``, else by the lead rank alone."""
    writer = FileSystemWriter(folder)
    if group is not None:
        save(state, storage_writer=writer, process_group=group)
    elif lead:
        with _single_process():
            save(state, storage_writer=writer, no_dist=True)


class _Known(FileSystemReader):
    """A reader that gives DCP the metadata the comparison already read: the file is read once."""

    def __init__(self, folder: Path, metadata: Metadata) -> None:
        super().__init__(folder)
        self.metadata = metadata

    def read_metadata(self, *args: object, **kwargs: object) -> Metadata:
        if self.metadata.storage_meta is not None:
            self.metadata.storage_meta.load_id = self.load_id
        return self.metadata


def read(state: dict[str, TensorState], folder: Path, metadata: Metadata, group: ProcessGroup | None) -> None:
    """Fill ``state``'s tensors (and replace its other leaves) from ``folder``, whose metadata was read."""
    reader = _Known(folder, metadata)
    if group is not None:
        load(state, storage_reader=reader, process_group=group)
    else:
        with _single_process():
            load(state, storage_reader=reader, no_dist=True)
