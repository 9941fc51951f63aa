"""scripts/layered_venv.py, which the set-up scripts build every venv with: a clone's venv reads
a shared one's packages and console scripts, holds this clone's idist alone, and a second run
changes nothing; old shared venvs are deleted, the ones in use are kept."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "layered_venv.py"

pytestmark = pytest.mark.slow  # it installs pip, setuptools and wheel into a fresh venv


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("layered_venv", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _layer(dest: Path, cache: Path, *pip: str) -> str:
    args = [a for line in pip for a in ("--pip", line)]
    env = {**os.environ, "IDIST_VENV_CACHE": str(cache)}
    r = subprocess.run([sys.executable, str(SCRIPT), str(dest), "probe", *args], capture_output=True, text=True,
                       env=env, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_clone_gets_its_own_idist_over_the_shared_packages(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    python = _layer(tmp_path / "a", cache, "wheel attrs")
    assert python == str(tmp_path / "a" / "bin" / "python")
    (shared,) = [p for p in cache.iterdir() if p.is_dir()]
    where = "import idist, wheel; print(idist.__file__); print(wheel.__file__)"
    idist_at, wheel_at = subprocess.run([python, "-c", where], capture_output=True, text=True, check=True,
                                        timeout=60).stdout.split()  # fmt: skip
    assert Path(idist_at) == ROOT / "src" / "idist" / "__init__.py"  # this clone's, editable
    assert Path(wheel_at).is_relative_to(shared)  # the shared venv's
    assert not list(shared.glob("lib/*/site-packages/*idist*"))  # the shared venv holds no idist
    # a shared console script runs with the clone's python; the clone's own idist has its own
    assert (tmp_path / "a" / "bin" / "wheel").read_text().startswith(f"#!{python}\n")
    r = subprocess.run([tmp_path / "a" / "bin" / "wheel", "version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("wheel "), r
    r = subprocess.run([tmp_path / "a" / "bin" / "idist", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "{run," in r.stdout, r

    built = (shared / ".idist-complete").stat().st_mtime
    assert _layer(tmp_path / "a", cache, "wheel attrs") == python  # again: nothing to do
    assert (shared / ".idist-complete").stat().st_mtime == built
    assert _layer(tmp_path / "b", cache, "wheel attrs") == str(tmp_path / "b" / "bin" / "python")
    assert [p for p in cache.iterdir() if p.is_dir()] == [shared]  # a second clone shares it


def test_only_the_two_most_recently_used_shared_venvs_of_a_name_stay(tmp_path: Path) -> None:
    module = _module()
    now = time.time()
    made = {}
    for age, name in enumerate(["main-new", "main-mid", "main-old", "main-oldest", "xla-old"]):
        d = tmp_path / name
        d.mkdir()
        (d / module.COMPLETE).touch()
        (d / module.USED).touch()
        os.utime(d / module.USED, (now - 100 * age, now - 100 * age))
        (tmp_path / f"{name}.lock").touch()
        made[name] = d
    (tmp_path / "main-building").mkdir()  # no marker yet: another run is building it
    left = ["main-building", "main-mid", "main-mid.lock", "main-new", "main-new.lock", "xla-old", "xla-old.lock"]
    module.prune(tmp_path, "main", made["main-new"])
    assert sorted(p.name for p in tmp_path.iterdir()) == left
    module.prune(tmp_path, "main", made["main-mid"])  # the one in use stays, even when older
    assert sorted(p.name for p in tmp_path.iterdir()) == left
