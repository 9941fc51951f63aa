"""Every Python block of README.md and docs/*.md type-checks under mypy --strict, as a user's program.

A block is a program of its own. An HTML comment on the line before its fence (invisible on the
site) may say how to check it:

- ``<!-- typecheck: skip: REASON -->``: not checked (the reason is required);
- ``<!-- typecheck: continues -->``: checked after the block before it in the same page;
- ``<!-- typecheck: given`` then lines of Python, then ``-->``: what the block takes as given
  (the names of a fragment: ``model: nn.Module``...), checked before it.

The configuration is a user's (tests/typing/user/mypy.ini): strict, with deprecated calls
reported. Errors are reported at their line in the page.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import attrs
import pytest

from typecheck import ROOT, mypy_report

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^(?P<indent>\s*)```(?:python|py)\s*$")
_DIRECTIVE = re.compile(r"^\s*<!-- typecheck: (?P<kind>skip|continues|given)(?P<rest>.*)$")


@attrs.define
class Program:
    """Blocks of one page checked as one module, and where each of its lines comes from."""

    page: Path
    lines: list[str] = attrs.Factory(list)
    origin: list[str] = attrs.Factory(list)  # "README.md:12", or "README.md:10 (given)"

    def add(self, lines: list[str], first: int, given: bool = False) -> None:
        for offset, line in enumerate(lines):
            self.lines.append(line)
            where = f"{self.page.relative_to(ROOT)}:{first + offset}"
            self.origin.append(f"{where} (given)" if given else where)


@attrs.frozen
class Skipped:
    where: str
    reason: str


def _directive(lines: list[str], fence: int) -> tuple[str, str, list[str], int]:
    """The directive before the fence at index ``fence``: (kind, text, given lines, index of its first line)."""
    end = fence - 1
    if end < 0 or not lines[end].strip().endswith("-->"):
        return "", "", [], fence
    start = end
    while start > 0 and "<!--" not in lines[start]:
        start -= 1
    m = _DIRECTIVE.match(lines[start])
    if m is None:
        return "", "", [], fence
    if m["kind"] == "given":
        return "given", "", textwrap.dedent("\n".join(lines[start + 1 : end])).splitlines(), start
    return m["kind"], m["rest"].removesuffix("-->").strip(" :"), [], start


def programs() -> tuple[list[Program], list[Skipped]]:
    out: list[Program] = []
    skipped: list[Skipped] = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        last: Program | None = None
        i = 0
        while i < len(lines):
            fence = _FENCE.match(lines[i])
            if fence is None:
                i += 1
                continue
            close = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            body = [line.removeprefix(fence["indent"]) for line in lines[i + 1 : close]]
            kind, text, given, start = _directive(lines, i)
            where = f"{page.relative_to(ROOT)}:{i + 1}"
            if kind == "skip":
                assert text, f"{where}: '<!-- typecheck: skip -->' needs a reason"
                skipped.append(Skipped(where, text))
            else:
                if kind == "continues":
                    assert last is not None, f"{where}: 'continues' with no block before it"
                    program = last
                else:
                    program = Program(page)
                    out.append(program)
                program.add(given, start + 2, given=True)
                program.add(body, i + 2)
                last = program
            i = close + 1
    return out, skipped


def test_the_blocks_are_found() -> None:
    found, skipped = programs()
    assert len(found) >= 15, found
    assert all(s.reason for s in skipped)


def test_every_python_block_type_checks(tmp_path: Path) -> None:
    found, _ = programs()
    files = []
    for n, program in enumerate(found):
        stem = re.sub(r"\W", "_", program.page.stem)
        path = tmp_path / f"block_{n}_{stem}.py"
        path.write_text("\n".join(program.lines) + "\n")
        files.append((path, program))
    config = ROOT / "tests" / "typing" / "user" / "mypy.ini"
    report = mypy_report([p for p, _ in files], config, ROOT / ".mypy_cache" / "typing-user")
    errors = [
        f"{program.origin[line - 1]}: {message}"
        for path, program in files
        for line, findings in sorted(report.get(path.resolve(), {}).items())
        for message in findings.messages
    ]
    assert not errors, "mypy --strict on the docs' code blocks:\n" + "\n".join(errors)


if __name__ == "__main__":  # print the programs, to see what is checked
    for program in programs()[0]:
        print(f"# ---- {program.origin[0] if program.origin else program.page}")
        print("\n".join(program.lines))
    pytest.main([__file__])
