"""Reading a checkpoint's pickles without running code from them.

``idist-values.pt``, DCP's ``.metadata`` and the values DCP pickles into its data files
are read by an unpickler that admits only the globals listed here: ``find_class`` is the
one door through which a pickle reaches code. Any other global raises ``Refused`` naming
it. The lists live here, per load: torch's process-wide safe globals are never changed.
``trusted=True`` (``weights_only=False``) reads with plain pickle, as torch does.
"""

from __future__ import annotations

import _compat_pickle
import importlib
import io
import os
import pickle
from typing import Any

import torch

from .._errors import CheckpointUnsafeError

#: what users save beside their models: containers, numbers, text, tensors, numpy arrays and
#: scalars, paths, dates, argparse namespaces, and the state dicts of optimizers, LR
#: schedulers and GradScaler (made of those); torch's dtypes and layouts are admitted by type
VALUES = frozenset(
    [f"builtins.{n}" for n in ("set", "frozenset", "complex", "bytearray", "slice", "range")]
    + [f"builtins.{n}" for n in ("list", "dict", "tuple", "int", "float", "str", "bool")]  # defaultdict factories
    + ["_codecs.encode"]  # bytes, in pickle protocol 2 (torch.save's)
    + [f"collections.{n}" for n in ("OrderedDict", "defaultdict", "Counter", "deque")]
    + ["torch.Size", "torch.device", "torch.Tensor", "torch.nn.parameter.Parameter", "torch.serialization._get_layout"]
    + ["torch._tensor._rebuild_from_type_v2"]
    + [f"torch._utils._rebuild_{n}" for n in ("tensor", "tensor_v2", "tensor_v3", "parameter", "parameter_with_state")]
    + [f"torch._utils._rebuild_{n}" for n in ("sparse_tensor", "meta_tensor_no_storage", "qtensor", "nested_tensor")]
    + [f"torch._utils._rebuild_device_tensor_from_{n}" for n in ("cpu_tensor", "numpy")]
    + [f"numpy.{m}multiarray.{n}" for m in ("core.", "_core.") for n in ("_reconstruct", "scalar")]
    + ["numpy.ndarray", "numpy.dtype"]
    + [f"pathlib.{m}{n}" for m in ("", "_local.") for n in ("PosixPath", "PurePosixPath", "Path", "PurePath")]
    + [f"pathlib.{m}{n}" for m in ("", "_local.") for n in ("WindowsPath", "PureWindowsPath")]
    + [f"datetime.{n}" for n in ("datetime", "date", "time", "timedelta", "timezone")]
    + ["argparse.Namespace", "types.SimpleNamespace"]
)
_DCP = "torch.distributed.checkpoint.metadata."
#: what DCP's ``.metadata`` holds: its dataclasses, shapes, dtypes, layouts and memory formats
METADATA = frozenset(
    [_DCP + n for n in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata")]
    + [_DCP + n for n in ("TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")]
    + ["torch.distributed.checkpoint.filesystem._StorageInfo", "torch.Size", "torch.serialization._get_layout"]
    + ["collections.OrderedDict", "builtins.set", "builtins.frozenset", "_codecs.encode"]
    + [f"pathlib.{m}{n}" for m in ("", "_local.") for n in ("PosixPath", "PurePosixPath", "Path", "PurePath")]
)
#: torch's constants pickled by name (``torch.float32``), admitted by their type
_TORCH_CONSTANTS = (torch.dtype, torch.layout, torch.memory_format, torch.qscheme)


class Refused(pickle.UnpicklingError):
    """A pickle named a global outside the list: ``name`` is its ``module.qualname``."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{name} is not one of the globals idist loads from a checkpoint")
        self.name = name
        #: the file (and entry) that named it, where the reader knows
        self.source: str | None = None


def _allowed(module: str, name: str, allowed: frozenset[str]) -> Any:
    """The global ``module.name`` if the list admits it (only then is its module imported)."""
    if module == "torch":
        value = vars(torch).get(name)
        if isinstance(value, _TORCH_CONSTANTS) or f"torch.{name}" in allowed:
            return value
        raise Refused(f"{module}.{name}")
    if module == "numpy.dtypes" and "numpy.dtype" in allowed:
        numpy = importlib.import_module("numpy")
        value = vars(importlib.import_module("numpy.dtypes")).get(name)
        if isinstance(value, type) and issubclass(value, numpy.dtype):
            return value
    if f"{module}.{name}" not in allowed:
        raise Refused(f"{module}.{name}")
    return getattr(importlib.import_module(module), name)


class _Restricted(pickle.Unpickler):
    allowed: frozenset[str] = frozenset()

    def find_class(self, module: str, name: str, /) -> Any:
        if (module, name) in _compat_pickle.NAME_MAPPING:  # Python 2 names, as pickle's own find_class maps them
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        return _allowed(module, name, self.allowed)


class _ValuesUnpickler(_Restricted):
    allowed = VALUES


class _MetadataUnpickler(_Restricted):
    allowed = METADATA


class _PickleModule:
    """What ``torch.load`` takes as ``pickle_module``: the restricted unpickler and its ``load``."""

    __name__ = "idist.checkpoint._unpickle"
    Unpickler = _ValuesUnpickler

    @staticmethod
    def load(file: io.BytesIO, **kwargs: Any) -> object:
        return _ValuesUnpickler(file, **kwargs).load()


def load_values(data: bytes, *, trusted: bool) -> object:
    """A ``torch.save`` file's object, tensors on the CPU; ``Refused`` for a global outside ``VALUES``."""
    if trusted:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    try:
        # the reader torch.load itself opens, so that both see the same records
        records = torch._C.PyTorchFileReader(io.BytesIO(data)).get_all_records() if data[:4] == b"PK\x03\x04" else None
    except RuntimeError:
        records = None
    if records is None:
        raise pickle.UnpicklingError("not a file torch.save writes (a zip archive)")
    if "constants.pkl" in records:  # what torch.load checks before it hands the file to torch.jit.load
        raise Refused("torch.jit.load (the file is a TorchScript archive, whose loading runs its code)")
    if os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in ("1", "y", "yes", "true"):
        # the user asked for torch's own list everywhere (and torch then refuses any other unpickler)
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False, pickle_module=_PickleModule)


def load_metadata(data: bytes, *, trusted: bool) -> object:
    """DCP's ``.metadata`` object; ``Refused`` for a global outside ``METADATA``."""
    if trusted:
        return pickle.loads(data)
    return _MetadataUnpickler(io.BytesIO(data)).load()


def refusal(exc: Refused, file: object, way_out: str) -> CheckpointUnsafeError:
    """The error for a refused global in ``file``, naming it and ``way_out`` (for checkpoints the user trusts)."""
    return CheckpointUnsafeError(
        f"refused {file}: it names {exc.name}, which idist does not load from a checkpoint by default (loading "
        f"it could run code); if you trust this checkpoint, {way_out}"
    )
