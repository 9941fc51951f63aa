"""A checkpoint from anywhere is safe to load and inspect: no code in its files runs unless the caller trusts it.

Each hostile file is a pickle whose ``__reduce__`` would create a marker folder: in
``idist-values.pt``, in DCP's ``.metadata`` and in a value inside DCP's data file. Loading
(``weights_only=True``, the default), ``idist checkpoint info`` and ``convert`` refuse it,
name the file and the global, and the marker never appears. What users actually save
round-trips by default; a user's own class is refused, then loads with ``weights_only=False``.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import json
import os
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

import idist
from idist import CheckpointError, CheckpointUnsafeError
from idist._cli import main as cli


class Evil:
    """Unpickling this creates ``marker``: the stand-in for any command a hostile file would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


@dataclasses.dataclass
class Plan:
    """A user's own class: safe, but nothing idist can know is safe."""

    steps: int


class WithExtra(nn.Module):
    """A module whose extra state DCP pickles into its data file."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.extra: object = None

    def get_extra_state(self) -> object:
        return self.extra

    def set_extra_state(self, state: object) -> None:
        self.extra = state


def _checkpoint(folder: Path) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    idist.save_checkpoint(folder, {"model": model, "epoch": 3})
    torch.manual_seed(1)
    fresh = nn.Linear(3, 2)
    return fresh, {k: v.clone() for k, v in fresh.state_dict().items()}


def _unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def _hostile_values(folder: Path, marker: Path) -> None:
    torch.save({"values": {"epoch": Evil(marker)}, "stateful": {}}, folder / "idist-values.pt")


def _hostile_metadata(folder: Path, marker: Path) -> None:
    metadata = pickle.loads((folder / ".metadata").read_bytes())
    metadata.planner_data = {"model": Evil(marker)}  # a real metadata object with one poisoned field
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))


@pytest.mark.parametrize(("poison", "file"), [(_hostile_values, "idist-values.pt"), (_hostile_metadata, ".metadata")])
def test_a_hostile_file_is_refused_by_load_and_never_runs(tmp_path: Path, poison: Any, file: str) -> None:
    marker = tmp_path / "pwned"
    fresh, before = _checkpoint(tmp_path / "ck")
    poison(tmp_path / "ck", marker)
    state: dict[str, object] = {"model": fresh, "epoch": 0}
    with pytest.raises(CheckpointUnsafeError) as info:
        idist.load_checkpoint(tmp_path / "ck", state)
    text = str(info.value)
    assert f"refused {tmp_path / 'ck' / file}" in text and "posix.mkdir" in text
    assert "weights_only=False" in text
    assert isinstance(info.value, CheckpointError) and isinstance(info.value, pickle.UnpicklingError)
    assert not marker.exists()
    assert _unchanged(fresh, before) and state["epoch"] == 0


def test_a_hostile_value_inside_dcps_data_file_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    source = WithExtra()
    dcp.save({"m": {**source.state_dict(), "_extra_state": Evil(marker)}}, checkpoint_id=tmp_path / "raw", no_dist=True)
    target = WithExtra()
    with pytest.raises(CheckpointUnsafeError, match=r"refused .*raw/__0_0\.distcp \(the value m\._extra_state\)"):
        idist.load_checkpoint(tmp_path / "raw", {"m": target})
    assert not marker.exists()
    assert cli(["checkpoint", "convert", str(tmp_path / "raw"), str(tmp_path / "out.pt")]) == 1
    assert not marker.exists() and not (tmp_path / "out.pt").exists()


def test_a_plain_pickle_in_place_of_the_values_is_never_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    fresh, before = _checkpoint(tmp_path / "ck")
    (tmp_path / "ck" / "idist-values.pt").write_bytes(pickle.dumps({"values": {"epoch": Evil(marker)}}))
    with pytest.raises(CheckpointError, match=r"idist-values\.pt cannot be read .*not a file torch\.save writes"):
        idist.load_checkpoint(tmp_path / "ck", {"model": fresh})  # torch.load would take it as a legacy file
    assert not marker.exists() and _unchanged(fresh, before)


def test_a_torchscript_archive_is_never_handed_to_torch_jit_load(tmp_path: Path) -> None:
    fresh, before = _checkpoint(tmp_path / "ck")
    torch.jit.save(torch.jit.script(nn.Linear(2, 2)), tmp_path / "ck" / "idist-values.pt")
    with pytest.raises(CheckpointUnsafeError, match="TorchScript"):
        idist.load_checkpoint(tmp_path / "ck", {"model": fresh})
    assert _unchanged(fresh, before)


def _common(tmp_path: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    return {
        "int": 7, "float": 0.1, "bool": True, "none": None, "str": "héllo ✓", "bytes": b"\x00\xff",
        "list": [1, [2.5]], "tuple": (1, "a"), "config": {"lr": 0.1, "layers": [64, 64], "name": "run"},
        "tensor": torch.arange(6.0).reshape(2, 3), "bf16": torch.ones(2, dtype=torch.bfloat16),
        "complex": torch.tensor([1 + 2j]), "torch_rng": torch.get_rng_state(), "py_rng": random.getstate(),
        "np_rng": np.random.get_state(), "array": np.arange(5.0), "int_array": np.arange(3, dtype=np.int16),
        "np_float": np.float32(1.5), "np_int": np.int64(3), "optim": opt.state_dict(),
        "sched": torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10).state_dict(),
        "scaler": torch.amp.GradScaler("cpu").state_dict(), "ordered": collections.OrderedDict(a=1),
        "set": {1, 2}, "args": argparse.Namespace(lr=0.1), "when": datetime.datetime(2026, 1, 2, 3, 4),
        "where": tmp_path, "dtype": torch.float16, "device": torch.device("cpu"), "size": torch.Size([2]),
    }  # fmt: skip


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and bool(np.array_equal(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def test_what_users_save_round_trips_by_default_and_torchs_list_is_untouched(tmp_path: Path) -> None:
    values = _common(tmp_path)
    scaler = torch.amp.GradScaler("cpu", init_scale=512.0)
    idist.save_checkpoint(tmp_path / "ck", {**values, "live_scaler": scaler})
    fresh_scaler = torch.amp.GradScaler("cpu")
    safe_before = torch.serialization.get_safe_globals()
    loaded = idist.load_checkpoint(tmp_path / "ck", {"live_scaler": fresh_scaler})
    assert torch.serialization.get_safe_globals() == safe_before  # nothing widened process-wide
    bad = [k for k in values if not _equal(values[k], loaded[k])]
    assert bad == []
    assert fresh_scaler.get_scale() == 512.0


def test_a_users_class_is_refused_then_loads_with_weights_only_false(tmp_path: Path) -> None:
    fresh, before = _checkpoint(tmp_path / "ck")
    torch.manual_seed(0)
    idist.save_checkpoint(tmp_path / "ck", {"model": nn.Linear(3, 2), "plan": Plan(4)})
    state: dict[str, object] = {"model": fresh, "plan": None}
    with pytest.raises(CheckpointUnsafeError) as info:
        idist.load_checkpoint(tmp_path / "ck", state)
    assert f"{Plan.__module__}.Plan" in str(info.value)
    assert "load_checkpoint(path, state, weights_only=False)" in str(info.value)
    assert _unchanged(fresh, before) and state["plan"] is None
    with pytest.raises(TypeError):
        idist.load_checkpoint(tmp_path / "ck", state, False)  # type: ignore[misc]  # keyword-only
    loaded = idist.load_checkpoint(tmp_path / "ck", state, weights_only=False)
    assert loaded["plan"] == Plan(4) and state["plan"] == Plan(4)
    assert not _unchanged(fresh, before)


def test_the_cli_refuses_in_one_line_and_shows_what_it_can(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "pwned"
    _checkpoint(tmp_path / "values")
    _hostile_values(tmp_path / "values", marker)
    assert cli(["checkpoint", "info", str(tmp_path / "values")]) == 1
    out, err = capsys.readouterr()
    assert "saved by serial on 1 rank(s)" in out and "  weight  float32  [2, 3]  24 B" in out  # manifest and tensors
    assert err.count("\n") == 1 and "refused" in err and "idist-values.pt" in err and "posix.mkdir" in err
    _checkpoint(tmp_path / "meta")
    _hostile_metadata(tmp_path / "meta", marker)
    assert cli(["checkpoint", "info", str(tmp_path / "meta")]) == 1
    out, err = capsys.readouterr()
    assert "saved by serial" in out and "weight" not in out and "epoch (value, int): 3" in out
    assert err.count("\n") == 1 and ".metadata" in err
    for folder in ("values", "meta"):
        assert cli(["checkpoint", "convert", str(tmp_path / folder), str(tmp_path / "out.pt")]) == 1
        assert "refused" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "out.pt").exists()


def test_convert_refuses_a_users_class_unless_trusted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    idist.save_checkpoint(tmp_path / "ck", {"model": nn.Linear(3, 2), "plan": Plan(2)})
    out = tmp_path / "whole.pt"
    assert cli(["checkpoint", "convert", str(tmp_path / "ck"), str(out)]) == 1
    assert "pass --trust" in capsys.readouterr().err and not out.exists()
    assert cli(["checkpoint", "convert", "--trust", str(tmp_path / "ck"), str(out)]) == 0
    assert torch.load(out, weights_only=False)["plan"] == Plan(2)
    assert cli(["checkpoint", "info", str(tmp_path / "ck")]) == 1  # info has no way to run it
    assert f"{Plan.__module__}.Plan" in capsys.readouterr().err


def test_a_dcp_folder_loads_and_shows_through_the_restricted_reader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    dcp.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "raw", no_dist=True)
    assert cli(["checkpoint", "info", str(tmp_path / "raw")]) == 0
    out = capsys.readouterr().out
    assert "no idist manifest" in out and "  weight  float32  [2, 3]  24 B" in out
    fresh = nn.Linear(3, 2)
    idist.load_checkpoint(tmp_path / "raw", {"model": fresh})
    assert torch.equal(fresh.weight, model.weight)


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ({"format": "someone-else", "version": 1}, "not an idist checkpoint manifest"),
        ({"format": "idist-checkpoint", "version": 99}, r"newer idist \(manifest version 99"),
        ("not json {", "not valid JSON"),
    ],
)
def test_a_manifest_idist_cannot_read_is_refused_clearly(tmp_path: Path, manifest: object, message: str) -> None:
    fresh, before = _checkpoint(tmp_path / "ck")
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    (tmp_path / "ck" / "idist.json").write_text(text)
    with pytest.raises(CheckpointError, match=message):
        idist.load_checkpoint(tmp_path / "ck", {"model": fresh})
    assert _unchanged(fresh, before)


def test_torchs_forced_weights_only_mode_still_loads_plain_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh, _ = _checkpoint(tmp_path / "ck")
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")
    assert idist.load_checkpoint(tmp_path / "ck", {"model": fresh})["epoch"] == 3
