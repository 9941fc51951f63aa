"""Horovod: a replicated model is saved once and loads on any world size (1, 2 and 3 ranks);
``strategy="fsdp"`` and ``no_sync`` raise ``TrainingSetupError`` saying what to use instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cases_checkpoint import make, snapshot
from hvdrun import hvdrun

import idist


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    folder = tmp_path_factory.mktemp("hvd-ckpt")
    return folder, hvdrun("cases_checkpoint:save", 2, str(folder), timeout=300)


def test_rank_0_writes_a_replicated_model_once(saved: tuple[Path, list[dict[str, Any]]]) -> None:
    _, ranks = saved
    assert ranks[0]["state"] == ranks[1]["state"]
    assert ranks[0]["files"] == [".metadata", "__0_0.distcp", "idist-values.pt", "idist.json"]


@pytest.mark.parametrize("world", [2, 3])
def test_horovod_ranks_load_it_on_any_world_size(saved: tuple[Path, list[dict[str, Any]]], world: int) -> None:
    folder, ranks = saved
    for r in hvdrun("cases_checkpoint:load", world, str(folder), timeout=300):
        assert r["state"] == ranks[0]["state"] and r["epoch"] == 3 and r["world"] == world
        assert r["missing"].startswith("CheckpointNotFoundError") and "every rank" in r["missing"]


def test_one_plain_process_loads_it(saved: tuple[Path, list[dict[str, Any]]]) -> None:
    folder, ranks = saved
    model, opt = make(seed=99)
    with idist.context("serial") as ctx:
        assert ctx.load_checkpoint(folder / "hvd", {"model": model, "optim": opt})["epoch"] == 3
    assert snapshot(model, opt) == ranks[0]["state"]


def test_fsdp_and_no_sync_point_to_what_horovod_offers(saved: tuple[Path, list[dict[str, Any]]]) -> None:
    for r in saved[1]:
        assert r["fsdp"].startswith("TrainingSetupError") and "HorovodContext (horovod)" in r["fsdp"]
        assert r["no_sync"].startswith("TrainingSetupError") and "backward_passes_per_step=K" in r["no_sync"]
