"""Reading and writing the tensor state with torch.distributed.checkpoint (DCP).

Over a torch process group, DCP plans the files together: each rank writes its own shards
(replicated tensors once) and reads what its tensors need, resharding as it goes. Without
one (serial, Horovod, XLA, simulated ranks: the model is replicated), rank 0 writes the
whole state alone and every rank reads it whole. DCP's own reader unpickles ``.metadata``
and the values in its data files freely; idist's reader and planners go through ``_unpickle``.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import save

from .._errors import CheckpointError
from . import _files, _unpickle

if TYPE_CHECKING:
    import io

    from torch.distributed import ProcessGroup
    from torch.distributed.checkpoint.planner import LoadPlanner, ReadItem

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


def read_metadata(folder: Path, *, trusted: bool) -> tuple[Metadata, bytes]:
    """DCP's metadata in ``folder`` (through the restricted unpickler unless ``trusted``) and its bytes."""
    data = (folder / _files.DCP_METADATA).read_bytes()
    metadata = _unpickle.load_metadata(data, trusted=trusted)
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{_files.DCP_METADATA} holds a {type(metadata).__name__}, not DCP's metadata")
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    return metadata, data


class Reader(FileSystemReader):
    """DCP's file reader, given the metadata already read (the file is read once, and never by plain pickle)."""

    def __init__(self, folder: Path, metadata: Metadata) -> None:
        super().__init__(folder)
        self.metadata = metadata

    def read_metadata(self, *args: object, **kwargs: object) -> Metadata:
        if self.metadata.storage_meta is not None:
            self.metadata.storage_meta.load_id = self.load_id
        return self.metadata


class _Values:
    """``load_bytes`` for DCP's planners: the values in the data files through ``_unpickle``."""

    trusted = False
    flatten_state_dict: bool
    original_state_dict: dict[str, object]
    state_dict: dict[str, object]
    mappings: dict[str, tuple[str | int, ...]]
    metadata: Metadata | None

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = _unpickle.load_values(value.getvalue(), trusted=self.trusted)
        except _unpickle.Refused as exc:
            info = self.metadata.storage_data.get(read_item.storage_index) if self.metadata is not None else None
            exc.source = f"{getattr(info, 'relative_path', 'a data file')} (the value {fqn})"
            raise
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


class Planner(_Values, DefaultLoadPlanner):
    """DCP's default load planner, reading values through ``_unpickle``."""

    def __init__(self, trusted: bool) -> None:
        super().__init__()
        self.trusted = trusted


class _Whole(_Values, _EmptyStateDictLoadPlanner):
    """The planner torch's own ``dcp_to_torch_save`` reads a whole checkpoint with, values through ``_unpickle``."""


#: torch leaves that planner's __init__ unannotated
_WHOLE: Callable[[], _Whole] = _Whole


def whole_planner(trusted: bool) -> LoadPlanner:
    planner = _WHOLE()
    planner.trusted = trusted
    return planner


def read(
    state: dict[str, TensorState], folder: Path, metadata: Metadata, group: ProcessGroup | None, trusted: bool
) -> None:
    """Fill ``state``'s tensors (and replace its other leaves) from ``folder``, whose metadata was read."""
    reader = Reader(folder, metadata)
    if group is not None:
        load(state, storage_reader=reader, planner=Planner(trusted), process_group=group)
    else:
        with _single_process():
            load(state, storage_reader=reader, planner=Planner(trusted), no_dist=True)
