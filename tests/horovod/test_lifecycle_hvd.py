"""Lifecycle on real Horovod: finalize, environment, adoption, scoped contexts, one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hvdrun import HERE, hvdrun

import idist
from launch_util import imported_after


@pytest.fixture(scope="module")
def life() -> list[dict[str, Any]]:
    return hvdrun("cases:lifecycle", 2, timeout=300)


def test_finalize_shuts_down_what_initialize_started(life: list[dict[str, Any]]) -> None:
    for r in life:
        assert r["dyn_env_during"] is None  # set for hvd.init only, then restored
        assert r["double_init"] == "AlreadyInitializedError"
        assert r["shutdown"] is True and r["env_restored"] is True
        assert r["closed"] == "ContextClosedError"
        assert r["current_after"] == "SerialContext"


def test_a_user_initialized_horovod_is_adopted_and_left_running(life: list[dict[str, Any]]) -> None:
    for rank, r in enumerate(life):
        assert r["adopted"] == ("HorovodContext", rank, 2, "adopted horovod")
        assert r["adopted_sum"] == 3
        assert r["adopted_group"] == [1.0]  # a group of rank 1 only: created as a process set
        assert r["same_adopted"] is True
        assert r["create_while_running"] == "AlreadyInitializedError"
        assert r["adopted_alive"] is True
        assert r["serial_after_shutdown"] == "SerialContext"


def test_a_scoped_context_initializes_and_finalizes(life: list[dict[str, Any]]) -> None:
    for r in life:
        assert r["scoped"] == ("HorovodContext", [0, 1])
        assert r["scoped_closed"] is True


def test_without_horovodrun_initialize_horovod_is_a_world_of_one() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent)])
    code = "import cases, json; print(json.dumps(cases.single_process()))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True, cwd=HERE
    )
    got = out.stdout.strip().splitlines()[-1]
    assert got == '{"world": [0, 1, "none"], "sum": [1.0, 1.0], "same": true, "gather": ["x"]}'


def test_importing_the_backend_does_not_import_horovod() -> None:
    assert imported_after("idist._backends.horovod", "horovod") == []
    assert idist.has_hvd_support() and "horovod" in idist.available_backends()


def test_the_stubs_only_name_what_exists() -> None:
    """A cheap guard beside stubtest: every name the stubs declare exists at run time."""
    import horovod.torch as hvd

    stub = (Path(__file__).resolve().parents[2] / "stubs" / "horovod" / "torch" / "__init__.pyi").read_text()
    names = [
        line.split("(")[0][4:] for line in stub.splitlines() if line.startswith("def ") and "__getattr__" not in line
    ]
    assert names and all(hasattr(hvd, n) for n in names), [n for n in names if not hasattr(hvd, n)]
