"""Without torch_xla (the main venv), the XLA backend says how to get it, on selection only."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

import idist

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None, reason="torch_xla is installed")


def test_initialize_raises_import_error_with_install_hint() -> None:
    with pytest.raises(idist.BackendUnavailableError) as info:
        idist.initialize("xla-tpu")
    assert isinstance(info.value, ImportError)
    assert "pip install torch==2.9.0 torch_xla==2.9.0" in str(info.value)
    assert "scripts/xla/setup-venv.sh" in str(info.value)
    with pytest.raises(ImportError), idist.context("xla-tpu"):
        pass
    assert idist.current().backend == "serial"  # nothing was left initialized


def test_support_probe_and_listing_say_no() -> None:
    assert not idist.has_xla_support()
    assert not idist.has_xla_support
    assert "xla-tpu" not in idist.available_backends()


def test_importing_idist_and_the_backend_module_does_not_import_torch_xla() -> None:
    code = "import sys, idist, idist._backends._xla; print('torch_xla' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
