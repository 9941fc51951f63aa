"""Run mypy and pyright over user programs, and read what each reports, line by line.

Shared by the user-side typing suite (tests/typing/user) and the docs' code blocks:
``mypy_report`` / ``pyright_report`` give ``{line: Findings}`` per file, where a finding is
an error code (mypy's ``[code]``, pyright's rule) or a revealed type. Revealed types are
compared without module paths (``torch._tensor.Tensor`` is ``Tensor``), since mypy names
them in full and pyright does not.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[1]
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


def pyright_report(files: list[Path], project: Path) -> Report:
    """pyright's errors (by rule) and revealed types for ``files``, with the config in ``project``."""
    cmd = [sys.executable, "-m", "pyright", "--outputjson", "--project", str(project), *map(str, files)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
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
