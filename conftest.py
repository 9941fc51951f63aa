"""How the suite runs on pytest-xdist workers (``bash scripts/test.sh`` uses ``-n 2 --dist loadgroup``).

- Each worker gets its own temporary folder (``TMPDIR`` and ``tempfile.tempdir``, under
  pytest's base folder), so what one worker's processes leave or look for never meets
  another's; ``tests/multiproc.py`` gives each worker its own range of loopback ports.
- A module-scoped (or session-scoped) fixture of the suite's own starts its processes once
  per worker that uses it, so the tests that share one stay on one worker (an
  ``xdist_group`` per module, per property runner); the rest spread one test at a time.
- Tests marked ``timed`` (``tests/conftest.py``) bound a time in seconds: they form one group,
  run one after another on one worker, so at most one other test (on the other worker) runs
  beside each of them and the timed tests never load each other.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

_SHARED_SCOPES = ("module", "package", "session")


def _group(item: pytest.Item) -> str | None:
    """The group of tests that share a process-starting fixture with ``item`` (None: none)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    callspec = getattr(item, "callspec", None)
    shared = [
        d[-1] for d in info.name2fixturedefs.values() if d[-1].scope in _SHARED_SCOPES and d[-1].baseid not in ("", ".")
    ]
    # (function-scoped fixtures, pytest's own such as tmp_path_factory, and this file's, which every
    # test has (pytest 9 gives them the base id "."), start nothing)
    if any(d.scope == "module" for d in shared):
        return item.nodeid.split("::", 1)[0]  # the module's fixtures, every parametrization, one worker
    for fixturedef in shared:
        name = fixturedef.argname
        param = callspec.params.get(name) if callspec is not None and fixturedef.params else None
        return f"{fixturedef.baseid}::{name}" + (f"[{getattr(param, 'label', param)}]" if param is not None else "")
    return None


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist registers it too; the lanes' venvs may run without xdist
    config.addinivalue_line("markers", "xdist_group(name): tests that run on one xdist worker")


# tryfirst: pytest-xdist's own hook turns each test's xdist_group marks into the suffix of its
# node id that ``--dist loadgroup`` schedules by, so the marks must be there before it runs (as
# trylast, they came after it: every group was spread over both workers). tests/conftest.py's
# hook, which marks the timed tests, is tryfirst too, and pluggy calls it first: among hooks of
# the same kind, the one registered later (the subfolder's conftest) runs earlier.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("timed") is not None:
            item.add_marker(pytest.mark.xdist_group("timed"))
        elif item.get_closest_marker("xdist_group") is None and (group := _group(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session", autouse=True)
def _worker_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        yield
        return
    folder = str(tmp_path_factory.mktemp(f"{worker}-tmp", numbered=False))
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = folder, folder
    try:
        yield
    finally:
        if saved[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[0]
        tempfile.tempdir = saved[1]
