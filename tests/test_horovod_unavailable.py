"""Without horovod installed (the main venv), selecting it fails at selection, with the hint."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

import idist
from idist import _stack

# tests/horovod looks like a namespace package "horovod" from here: only a real one counts
_spec = importlib.util.find_spec("horovod")
pytestmark = pytest.mark.skipif(
    _spec is not None and _spec.origin is not None, reason="horovod is installed here; the Horovod lane covers it"
)


@pytest.fixture(autouse=True)
def _clean() -> object:
    yield
    idist.finalize()


def test_initialize_horovod_raises_import_error_with_install_hint() -> None:
    with pytest.raises(idist.BackendUnavailableError) as info:
        idist.initialize("horovod")
    assert isinstance(info.value, ImportError)
    assert "HOROVOD_WITH_PYTORCH=1" in str(info.value)
    assert "scripts/horovod/build-wheel.sh" in str(info.value)
    # the failed initialize left no default behind: a second try fails the same way
    assert _stack._default is None
    with pytest.raises(ImportError, match="Horovod is not installed"):
        idist.initialize("horovod")


def test_scoped_context_raises_the_same() -> None:
    with pytest.raises(idist.BackendUnavailableError, match="pip install"), idist.context("horovod"):
        pytest.fail("the block must not run")


def test_support_probes_say_no() -> None:
    assert not idist.has_hvd_support()
    assert not idist.has_hvd_support
    assert "horovod" not in idist.available_backends()


def test_horovod_under_horovodrun_env_still_raises_the_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOROVOD_RANK", "0")
    monkeypatch.setenv("HOROVOD_SIZE", "1")
    with pytest.raises(idist.BackendUnavailableError, match="HOROVOD_WITH_GLOO"):
        idist.initialize()


def test_importing_idist_and_the_backend_module_never_imports_horovod() -> None:
    code = (
        "import sys, idist, idist._backends._horovod as h\n"
        "assert h.HorovodContext.MODEL_NAME == 'horovod-dist'\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'horovod'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_horovod_context_is_final() -> None:
    # typing.final marks the class at run time (checked statically in tests/typing/check_horovod.py)
    assert getattr(idist.HorovodContext, "__final__", False) is True
    assert issubclass(idist.HorovodContext, idist.DistContext)
