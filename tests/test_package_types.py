"""The types a user gets from the wheel: build it, install it in a fresh venv, type-check user programs.

As scripts/check-package.sh does (torch==2.13.0 first, so nothing pulls a CUDA build; then the
wheel, not editable), and from a folder outside the checkout, so that nothing of src/ or stubs/
is seen: the user programs of tests/typing/user must get exactly the errors and revealed types
they are marked with, as they do against the checkout. ``hctx.auto_optim(opt, process_set=12345)``
is refused only if the Horovod stubs came with the wheel (horovod-stubs, PEP 561).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from typecheck import CHECKERS, ROOT, Report, mypy_report, problems, pyright_available, pyright_report

PROGRAMS = sorted((ROOT / "tests" / "typing" / "user").glob("*.py"))
BASE_PYTHON = os.environ.get("PYTHON", "python3.11")


def _run(cmd: list[str], cwd: Path, timeout: float = 900) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the python of a fresh venv that has it installed)."""
    if shutil.which(BASE_PYTHON) is None:
        pytest.skip(f"{BASE_PYTHON} is not here to make a fresh venv from")
    # scripts/package-build.sh, as check-package.sh: the sdist, the wheel from it (a build/ left
    # in the checkout cannot leak in), a fresh venv with torch==2.13.0 and then the wheel. Under
    # scripts/test.sh into the run's IDIST_PACKAGE_DIR, so the package stage reuses it.
    shared = os.environ.get("IDIST_PACKAGE_DIR")
    work = Path(shared) if shared else tmp_path_factory.mktemp("package")
    _run(["bash", str(ROOT / "scripts" / "package-build.sh"), str(work)], cwd=ROOT)
    (wheel,) = (work / "dist").glob("idist-*.whl")
    return wheel, work / "venv" / "bin" / "python"


def test_the_wheel_holds_every_module_and_the_stubs(installed: tuple[Path, Path]) -> None:
    names = set(zipfile.ZipFile(installed[0]).namelist())
    sources = {p.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src" / "idist").rglob("*.py")}
    assert not sources - names, f"modules of src/idist missing from the wheel: {sorted(sources - names)}"
    stubs = {
        "horovod-stubs/" + p.relative_to(ROOT / "stubs" / "horovod").as_posix()
        for p in (ROOT / "stubs" / "horovod").rglob("*.pyi")
    }
    assert stubs and not stubs - names, f"stubs missing from the wheel: {sorted(stubs - names)}"
    assert "idist/py.typed" in names


@pytest.fixture(scope="module")
def reports(
    installed: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Report], list[Path]]:
    """Both checkers over copies of the user programs, in a folder of their own, against the venv."""
    _, python = installed
    user = tmp_path_factory.mktemp("user")
    copies = [Path(shutil.copy(p, user / p.name)) for p in PROGRAMS]
    (user / "mypy.ini").write_text(
        "[mypy]\nstrict = True\nenable_error_code = deprecated\nuntyped_calls_exclude = torch._tensor.Tensor.backward\n"
    )
    config = {"strict": ["."], "pythonVersion": "3.11", "reportMissingModuleSource": "none"}
    (user / "pyrightconfig.json").write_text(json.dumps(config))
    # the two checkers are separate processes: side by side, so this waits for the slower only
    with ThreadPoolExecutor(2) as pool:
        mypy = pool.submit(mypy_report, copies, user / "mypy.ini", user / ".mypy_cache", cwd=user, python=str(python))
        pyright = pool.submit(lambda: pyright_report(copies, user, python=str(python)) if pyright_available() else None)
        out = {"mypy": mypy.result()}
        if (found := pyright.result()) is not None:
            out["pyright"] = found
    return out, copies


@pytest.mark.parametrize("checker", CHECKERS)
def test_user_programs_type_check_against_the_installed_wheel(
    checker: str, reports: tuple[dict[str, Report], list[Path]]
) -> None:
    found, copies = reports
    if checker not in found:
        pytest.skip(f"{checker} does not run here")
    failures = [f"{path.name}: {p}" for path in copies for p in problems(path, checker, found[checker])]
    assert not failures, f"{checker} against the installed wheel:\n" + "\n".join(failures)
