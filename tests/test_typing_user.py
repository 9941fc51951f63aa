"""The user-side typing suite: tests/typing/user, checked by mypy --strict and pyright strict.

Each ``reject_*.py`` is a program a user could write that fails when it runs; the statement
after a ``# rejected: mypy[codes] pyright[rules]`` line must get exactly those errors from
each checker (``[]``: none from that one), and no other line any. Each ``pass_*.py`` must
type-check clean in both, and each ``reveal_type(...)  # revealed: T`` must reveal ``T``
(without module paths). tests/test_typing_runtime.py runs the same programs on simulated
ranks: the rejected calls fail, the accepted ones work.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import attrs
import pytest

from typecheck import ROOT, Report, mypy_report, pyright_available, pyright_report

USER = ROOT / "tests" / "typing" / "user"
PROGRAMS = sorted(USER.glob("*.py"))
CHECKERS = ("mypy", "pyright")
_REJECTED = re.compile(r"^\s*# rejected: (?P<spec>.*)$")
_CODES = re.compile(r"(?P<checker>mypy|pyright)\[(?P<codes>[\w,\- ]*)\]")
_REVEALED = re.compile(r"reveal_type\(.*\)\s+# revealed: (?P<type>.*)$")


@attrs.frozen
class Expected:
    """A program's marks: per rejected statement its lines and codes; per revealing line its type."""

    rejected: dict[range, dict[str, set[str]]]
    revealed: dict[int, str]


def _statement_lines(tree: ast.Module, line: int) -> range:
    """The lines of the statement starting at ``line`` (a compound statement: its header only)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and node.lineno == line:
            body = getattr(node, "body", None)
            end = body[0].lineno - 1 if isinstance(body, list) and body else node.end_lineno or line
            return range(line, end + 1)
    raise AssertionError(f"no statement starts on line {line} (a '# rejected:' line must precede one)")


def expected(path: Path) -> Expected:
    text = path.read_text()
    tree = ast.parse(text)
    lines = text.splitlines()
    rejected: dict[range, dict[str, set[str]]] = {}
    revealed: dict[int, str] = {}
    for number, line in enumerate(lines, start=1):
        mark = _REJECTED.match(line)
        if mark is not None:
            codes = {
                m["checker"]: {c.strip() for c in m["codes"].split(",") if c.strip()} for m in _CODES.finditer(line)
            }
            assert set(codes) == set(CHECKERS), f"{path.name}:{number}: name both checkers: {line.strip()}"
            rejected[_statement_lines(tree, number + 1)] = codes
        seen = _REVEALED.search(line)
        if seen is not None:
            revealed[number] = seen["type"].strip()
    return Expected(rejected, revealed)


def problems(path: Path, checker: str, report: Report) -> list[str]:
    """How ``checker``'s report on ``path`` differs from the program's marks (empty: it matches)."""
    want = expected(path)
    found = report.get(path.resolve(), {})
    out: list[str] = []
    covered: set[int] = set()
    for lines, codes in want.rejected.items():
        covered.update(lines)
        got = set().union(*(found[n].codes for n in lines if n in found))
        if got != codes[checker]:
            said = [msg for n in lines if n in found for msg in found[n].messages]
            out.append(f"line {lines.start}: expected {sorted(codes[checker])}, got {sorted(got)} {said}")
    for n, findings in sorted(found.items()):
        if findings.codes and n not in covered:
            out.append(f"line {n}: unexpected {sorted(findings.codes)} {findings.messages}")
        if findings.revealed and n not in want.revealed:
            out.append(f"line {n}: reveal_type without '# revealed:' ({findings.revealed})")
    for n, type_ in sorted(want.revealed.items()):
        got_types = found[n].revealed if n in found else []
        if got_types != [type_]:
            out.append(f"line {n}: expected revealed {type_!r}, got {got_types}")
    return out


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Report]:
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
