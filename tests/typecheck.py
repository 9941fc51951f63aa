"""Run mypy and pyright over user programs, and compare what each reports with the programs' marks.

Shared by the user-side typing suite (tests/typing/user, against the checkout and against the
installed wheel) and the docs' code blocks. ``mypy_report`` / ``pyright_report`` give
``{line: Findings}`` per file: error codes (mypy's ``[code]``, pyright's rule) and revealed
types, compared without module paths (``torch._tensor.Tensor`` is ``Tensor``), since mypy names
them in full and pyright does not. ``problems`` lists where a report differs from the marks:
the statement after ``# rejected: mypy[codes] pyright[rules]`` gets exactly those (``[]``:
none), no other line any error, and ``reveal_type(x)  # revealed: T`` reveals ``T``.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[1]
CHECKERS = ("mypy", "pyright")
_MYPY_LINE = re.compile(
    r"^(?P<file>[^:]+):(?P<line>\d+): (?P<severity>error|note): (?P<message>.*?)(?:  \[(?P<code>[\w-]+)\])?$"
)
_REVEALED_MYPY = re.compile(r'^Revealed type is "(?P<type>.*)"$')
_REVEALED_PYRIGHT = re.compile(r'^Type of ".*" is "(?P<type>.*)"$', re.S)
_MODULE_PATH = re.compile(r"\b(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])")


@attrs.define
class Findings:
    """What one checker reported on one line."""

    codes: set[str] = attrs.Factory(set)
    revealed: list[str] = attrs.Factory(list)
    messages: list[str] = attrs.Factory(list)


Report = dict[Path, dict[int, Findings]]


def short_type(text: str) -> str:
    """A revealed type without module paths: ``idist._context.DistContext[idist._exchange.Comm]``
    reads ``DistContext[Comm]``, as pyright writes it."""
    return _MODULE_PATH.sub("", text.strip())


def mypy_report(files: list[Path], config: Path, cache: Path, cwd: Path = ROOT, python: str | None = None) -> Report:
    """mypy's errors (by code) and revealed types for ``files``, run with ``config``."""
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir", str(cache)]
    cmd += ["--no-error-summary", "--hide-error-context", "--no-pretty", "--show-absolute-path"]
    if python is not None:
        cmd += ["--python-executable", python]
    proc = subprocess.run([*cmd, *map(str, files)], cwd=cwd, capture_output=True, text=True, timeout=600)
    if proc.returncode not in (0, 1) or proc.stderr.strip():
        raise RuntimeError(f"mypy failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    report: Report = defaultdict(lambda: defaultdict(Findings))
    for raw in proc.stdout.splitlines():
        m = _MYPY_LINE.match(raw)
        if m is None:
            continue
        found = report[Path(m["file"]).resolve()][int(m["line"])]
        revealed = _REVEALED_MYPY.match(m["message"])
        if m["severity"] == "note" and revealed is not None:
            found.revealed.append(short_type(revealed["type"]))
        elif m["severity"] == "error":
            found.codes.add(m["code"] or "syntax")
            found.messages.append(m["message"])
    return report


def pyright_available() -> bool:
    """Whether pyright runs here (the pip package fetches node on first use)."""
    if shutil.which("pyright") is None and not _has_module("pyright"):
        return False
    proc = subprocess.run([sys.executable, "-m", "pyright", "--version"], capture_output=True, text=True, timeout=300)
    return proc.returncode == 0


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def pyright_report(files: list[Path], project: Path, python: str | None = None) -> Report:
    """pyright's errors (by rule) and revealed types for ``files``, with the config in ``project``
    (and the packages of ``python``, when given)."""
    cmd = [sys.executable, "-m", "pyright", "--outputjson", "--project", str(project)]
    if python is not None:
        cmd += ["--pythonpath", python]
    proc = subprocess.run([*cmd, *map(str, files)], cwd=project, capture_output=True, text=True, timeout=600)
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"pyright failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from None
    report: Report = defaultdict(lambda: defaultdict(Findings))
    for diag in data["generalDiagnostics"]:
        found = report[Path(diag["file"]).resolve()][diag["range"]["start"]["line"] + 1]
        revealed = _REVEALED_PYRIGHT.match(diag["message"])
        if diag["severity"] == "information" and revealed is not None:
            found.revealed.append(short_type(revealed["type"]))
        elif diag["severity"] == "error":
            found.codes.add(diag.get("rule") or "error")
            found.messages.append(diag["message"].splitlines()[0])
    return report


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
