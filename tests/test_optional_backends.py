"""Horovod and torch_xla are optional: ``import idist`` never imports them, and where one is
missing (the main venv) selecting it fails at selection, with the install hint."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import idist
from idist import _stack
from launch_util import imported_after, installed

#: backend -> (its package, what its hint must say, its support probe)
OPTIONAL: dict[str, tuple[str, tuple[str, ...], Callable[[], bool]]] = {
    "horovod": ("horovod", ("HOROVOD_WITH_PYTORCH=1", "scripts/horovod/build-wheel.sh"), idist.has_hvd_support),
    "xla-tpu": ("torch_xla", ("pip install torch==2.9.0 torch_xla==2.9.0", "scripts/xla/setup-venv.sh"),
                idist.has_xla_support),
}  # fmt: skip


def _missing(backend: str) -> str:
    package = OPTIONAL[backend][0]
    if installed(package):
        pytest.skip(f"{package} is installed here; its lane covers it")
    return package


@pytest.fixture(autouse=True)
def _clean() -> object:
    yield
    idist.finalize()


@pytest.mark.parametrize("backend", OPTIONAL)
def test_importing_idist_and_the_backend_never_imports_the_package(backend: str) -> None:
    package = OPTIONAL[backend][0]
    module = {"horovod": "horovod", "xla-tpu": "xla"}[backend]
    assert imported_after(f"idist._backends.{module}", package) == []


@pytest.mark.parametrize("backend", OPTIONAL)
def test_selecting_a_missing_backend_raises_its_install_hint(backend: str) -> None:
    _missing(backend)
    _, hints, _ = OPTIONAL[backend]
    with pytest.raises(idist.BackendUnavailableError) as info:
        idist.initialize(backend)  # type: ignore[call-overload]  # a str from the table, one of the names
    assert isinstance(info.value, ImportError)
    assert all(h in str(info.value) for h in hints), str(info.value)
    assert _stack._default is None  # the failed initialize left no default behind
    with pytest.raises(idist.BackendUnavailableError, match="install"):
        idist.initialize(backend)  # type: ignore[call-overload]  # (see above)
    with pytest.raises(ImportError), idist.context(backend):  # type: ignore[call-overload]  # (see above)
        pytest.fail("the block must not run")
    assert idist.current().backend == "serial"  # nothing was left initialized


@pytest.mark.parametrize("backend", OPTIONAL)
def test_support_probes_and_listing_say_no(backend: str) -> None:
    _missing(backend)
    probe = OPTIONAL[backend][2]
    assert not probe()
    assert not probe
    assert backend not in idist.available_backends()


def test_horovod_under_horovodrun_env_still_raises_the_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    _missing("horovod")
    monkeypatch.setenv("HOROVOD_RANK", "0")
    monkeypatch.setenv("HOROVOD_SIZE", "1")
    with pytest.raises(idist.BackendUnavailableError, match="HOROVOD_WITH_GLOO"):
        idist.initialize()
