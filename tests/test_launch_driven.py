"""spawn/Parallel with backend="horovod" / "xla-tpu" in the main venv (neither package installed).

What runs them for real is the Horovod lane (tests/horovod/test_spawn_hvd.py) and the XLA lane
(tests/xla/test_spawn_xla.py). Here: a missing package says how to install it, before any
process starts; arguments those launchers cannot honour raise ``LaunchConfigError``; XLA
launcher detection never fires without torch_xla's launcher.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from collections.abc import Callable
from typing import Any

import pytest

import idist
import launch_fns
from idist import _detect
from idist.launch import LaunchConfigError, launched_by
from idist.launch._driven import installed

pytestmark = pytest.mark.timeout(300)

MISSING = {b: not installed(pkg) for b, pkg in (("horovod", "horovod"), ("xla-tpu", "torch_xla"))}
HINTS = {"horovod": "HOROVOD_WITH_PYTORCH=1", "xla-tpu": "pip install torch==2.9.0 torch_xla==2.9.0"}


def env_of(local_rank: int, names: list[str]) -> dict[str, str | None]:
    """(In a spawned rank) the variables ``names`` as this rank sees them."""
    return {n: os.environ.get(n) for n in names}


def _children() -> set[int]:
    """This process's live child pids (from /proc; a launch must not leave any)."""
    me = str(os.getpid())
    out = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me and fields[0] != "Z":
                out.add(int(entry.name))
    return out


@pytest.mark.parametrize("backend", ["horovod", "xla-tpu"])
def test_a_missing_package_raises_the_install_hint_before_anything_starts(backend: str) -> None:
    if not MISSING[backend]:
        pytest.skip(f"{backend} is installed here; its lane runs the real launch")
    before = _children()
    start = time.monotonic()
    for call in (
        lambda: idist.spawn(backend, launch_fns.add, (1,), nproc_per_node=2),  # type: ignore[call-overload]
        lambda: idist.Parallel(backend=backend, nproc_per_node=2).run(launch_fns.add, 1),
        lambda: idist.Parallel(backend=backend, nprocs=1).run(launch_fns.add, 1),
    ):
        with pytest.raises(idist.BackendUnavailableError, match=HINTS[backend]) as info:
            call()
        assert isinstance(info.value, ImportError)
    assert time.monotonic() - start < 10  # no launcher process was started to find out
    assert _children() == before


@pytest.mark.parametrize("backend", ["horovod", "xla-tpu"])
@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"join": False}, "always joins"),
        ({"daemon": True}, "daemon=True"),
        ({"nnodes": 2, "master_port": 29400}, "runs on one node"),
        ({"master_port": 29400}, "chooses its own rendezvous"),
        ({"master_addr": "127.0.0.1"}, "chooses its own rendezvous"),
        ({"init_method": "tcp://127.0.0.1:29400"}, "chooses its own rendezvous"),
        ({"nproc_per_node": 0}, "at least 1"),
        ({"start_method": "threads"}, "start_method"),
    ],
)  # fmt: skip
def test_options_the_backends_launcher_cannot_honour(backend: str, options: dict[str, Any], match: str) -> None:
    kw: dict[str, Any] = {"nproc_per_node": 2, **options}
    with pytest.raises(LaunchConfigError, match=match) as info:
        idist.spawn(backend, launch_fns.add, (1,), **kw)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("backend", ["horovod", "xla-tpu"])
def test_fn_and_args_are_checked_first(backend: str) -> None:
    bad: list[Callable[[], object]] = [
        lambda: idist.spawn(backend, "not callable", (1,), nproc_per_node=2),  # type: ignore[call-overload]
        lambda: idist.spawn(backend, launch_fns.add, 1, nproc_per_node=2),  # type: ignore[call-overload]
    ]
    for call in bad:
        with pytest.raises(LaunchConfigError, match="must be"):
            call()


def test_unknown_backends_list_what_spawn_can_start() -> None:
    with pytest.raises(LaunchConfigError, match="gloo, nccl, horovod, xla-tpu"):
        idist.spawn("tpu", launch_fns.add, (1,))  # type: ignore[call-overload]


# ------------------------------------------------------------ XLA detection
@pytest.fixture
def fake_torch_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make torch_xla look loaded (detection only checks that it is; nothing is called)."""
    monkeypatch.setitem(sys.modules, "torch_xla", types.ModuleType("torch_xla"))
    for var in ("PJRT_LOCAL_PROCESS_COUNT", "PJRT_LOCAL_PROCESS_RANK", "PJRT_DEVICE"):
        monkeypatch.delenv(var, raising=False)


def test_plain_environments_never_detect_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch_xla's launcher variables without torch_xla loaded: a leftover, not a replica
    monkeypatch.setenv("PJRT_LOCAL_PROCESS_COUNT", "1")
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.delitem(sys.modules, "torch_xla", raising=False)
    assert not _detect.xla_replica()
    assert _detect.detect_backend() == "serial"
    assert launched_by() is None


@pytest.mark.usefixtures("fake_torch_xla")
def test_torch_xla_loaded_with_only_pjrt_device_is_not_a_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "TPU")  # TPU VMs export it for every process
    assert _detect.detect_backend() == "serial"
    assert launched_by() is None
    with idist.Parallel() as parallel:  # in place, no launcher: serial
        assert parallel.run(launch_fns.current_kind) == [("SerialContext", 0, 1, 0)]


@pytest.mark.usefixtures("fake_torch_xla")
def test_torch_xla_launcher_variables_select_xla_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_LOCAL_PROCESS_COUNT", "1")
    monkeypatch.setenv("PJRT_LOCAL_PROCESS_RANK", "0")
    assert _detect.detect_backend() == "xla-tpu"
    assert launched_by() == "torch_xla"
    # xmp.spawn called inside a torchrun job: its replicas are XLA's, not torchrun's ranks
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400"}.items():
        monkeypatch.setenv(k, v)
    assert _detect.detect_backend() == "xla-tpu"
    with pytest.raises(LaunchConfigError, match="started by torch_xla"):
        idist.Parallel(nproc_per_node=2)


def test_spawned_native_ranks_drop_an_enclosing_xla_launchers_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_LOCAL_PROCESS_COUNT", "2")
    monkeypatch.setenv("PJRT_LOCAL_PROCESS_RANK", "0")
    out = idist.spawn(env_of, (["PJRT_LOCAL_PROCESS_COUNT", "PJRT_LOCAL_PROCESS_RANK", "RANK"],), nprocs=2)
    assert out == [{"PJRT_LOCAL_PROCESS_COUNT": None, "PJRT_LOCAL_PROCESS_RANK": None, "RANK": str(r)} for r in (0, 1)]


def test_initialize_in_a_fresh_interpreter_stays_serial_without_a_launcher() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_", "HOROVOD_", "RANK", "WORLD_SIZE"))}
    env["PJRT_DEVICE"] = "CPU"
    code = "import idist; c = idist.initialize(); print(type(c).__name__, c.backend); idist.finalize()"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["SerialContext", "serial"]
