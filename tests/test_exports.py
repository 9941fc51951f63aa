"""The public surface: what each package exports, which classes are final, and that a
context really is immutable (no copy shares its state)."""

from __future__ import annotations

import copy
import inspect
import subprocess
import sys
from types import ModuleType

import attrs
import pytest

import idist
import idist.launch
import idist.testing
import idist.training

#: exported classes that users subclass (or that are bases by design), so not final
OPEN_CLASSES = {
    idist.DistContext,  # the backend base class
    idist.AutoDataLoader,  # the XLA backend gives its loaders a subclass
    idist.testing.Runner,  # a Protocol
}


def _exported_classes(module: ModuleType) -> list[type]:
    return [obj for name in module.__all__ if inspect.isclass(obj := getattr(module, name))]


@pytest.mark.parametrize("module", [idist, idist.launch, idist.testing, idist.training], ids=lambda m: m.__name__)
def test_every_exported_name_exists_once(module: ModuleType) -> None:
    names = list(module.__all__)
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    assert all(hasattr(module, n) for n in names)


@pytest.mark.parametrize("module", [idist, idist.launch, idist.testing, idist.training], ids=lambda m: m.__name__)
def test_exported_concrete_classes_are_final(module: ModuleType) -> None:
    for cls in _exported_classes(module):
        if issubclass(cls, BaseException) or cls in OPEN_CLASSES:
            continue  # exceptions are subclassed by users' code by design
        assert getattr(cls, "__final__", False), f"{module.__name__}.{cls.__name__} is not @final"


def test_the_type_aliases_are_exported() -> None:
    for name in ("BackendName", "GroupArg", "ModelName", "NativeBackend", "ReduceOp", "HorovodReduceOp"):
        assert name in idist.__all__


def test_a_context_cannot_be_evolved_or_copied() -> None:
    with idist.context("gloo") as ctx:
        with pytest.raises(TypeError, match="cannot be copied"):
            attrs.evolve(ctx)
        with pytest.raises(TypeError, match="cannot be copied"):
            copy.copy(ctx)
        with pytest.raises(TypeError, match="cannot be copied"):
            copy.deepcopy(ctx)
        assert idist.all_reduce(2) == 2  # the original is untouched
    assert ctx.closed


def test_a_context_is_frozen() -> None:
    ctx = idist.current()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        ctx.backend = "gloo"  # type: ignore[misc]


def test_every_error_a_user_can_catch_is_exported() -> None:
    import idist._errors as errors

    raised = {name for name, obj in vars(errors).items() if inspect.isclass(obj) and issubclass(obj, idist.IdistError)}
    assert raised <= set(idist.__all__), sorted(raised - set(idist.__all__))


def test_importing_idist_imports_no_torch_until_a_name_is_used() -> None:
    # `idist run` and `idist --help` start in a fraction of a second; the names (and submodules, as
    # `idist.training`) load on first use
    code = (
        "import sys, idist, idist.launch\n"
        "before = 'torch' in sys.modules\n"
        "names = set(dir(idist)) >= set(idist.__all__) and 'spawn' in dir(idist.launch)\n"
        "missing = not hasattr(idist, 'no_such_name') and not hasattr(idist.launch, 'no_such_name')\n"
        "subs = idist.training.AutoDataLoader is idist.AutoDataLoader and idist.launch is sys.modules['idist.launch']\n"
        "from idist import *\n"
        "print(before, names, missing and subs, all_reduce is idist.all_reduce, 'torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True", "True", "True", "True"], proc.stdout


def test_a_subpackage_imported_alone_finds_the_current_context() -> None:
    # DistributedProxySampler without num_replicas/rank asks the context stack, which nothing
    # imported yet: `import idist` no longer imports every module
    code = (
        "import torch.utils.data as d\n"
        "from idist.training import DistributedProxySampler\n"
        "print(len(list(DistributedProxySampler(d.SequentialSampler(range(10))))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["10"], proc.stdout
