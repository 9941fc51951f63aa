"""The user-side typing suite: tests/typing/user, checked by mypy --strict and pyright strict.

Each ``reject_*.py`` is a program a user could write that fails when it runs; the statement
after a ``# rejected: mypy[codes] pyright[rules]`` line must get exactly those errors from
each checker (``[]``: none from that one), and no other line any. Each ``pass_*.py`` must
type-check clean in both, and each ``reveal_type(...)  # revealed: T`` must reveal ``T``
(without module paths). tests/test_typing_runtime.py runs the same programs on simulated
ranks: the rejected calls fail, the accepted ones work.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from typecheck import CHECKERS, ROOT, Report, expected, mypy_report, problems, pyright_available, pyright_report

USER = ROOT / "tests" / "typing" / "user"
PROGRAMS = sorted(USER.glob("*.py"))


@pytest.fixture(scope="module")
def reports() -> dict[str, Report]:
    """Each checker run once over every program (one mypy process, one pyright process)."""
    out = {"mypy": mypy_report(PROGRAMS, USER / "mypy.ini", ROOT / ".mypy_cache" / "typing-user")}
    if pyright_available():
        out["pyright"] = pyright_report(PROGRAMS, USER)
    return out


def test_every_program_is_marked() -> None:
    for path in PROGRAMS:
        want = expected(path)
        if path.name.startswith("reject_"):
            assert want.rejected, f"{path.name} rejects nothing"
        else:
            assert path.name.startswith("pass_") and not want.rejected, path.name
            assert want.revealed, f"{path.name} reveals no type"


@pytest.mark.parametrize("checker", CHECKERS)
@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.name)
def test_checker_sees_what_the_program_expects(path: Path, checker: str, reports: dict[str, Report]) -> None:
    if checker not in reports:
        pytest.skip(f"{checker} does not run here")
    found = problems(path, checker, reports[checker])
    assert not found, f"{checker} on {path.relative_to(ROOT)}:\n" + "\n".join(found)
