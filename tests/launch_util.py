"""Helpers shared by the launcher tests: process liveness, pid markers, subprocess runs."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
ROOT = HERE.parent
SCRIPTS = HERE / "launch_scripts"


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited but not reaped, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def wait_gone(pids: Sequence[int], timeout: float = 20.0) -> list[int]:
    """Wait until none of ``pids`` runs; return those still running at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def marker_pids(marker: Path, n: int) -> list[int]:
    """The pids written so far in ``marker.0`` .. ``marker.<n-1>`` (missing or empty files skipped)."""
    files = [Path(f"{marker}.{i}") for i in range(n)]
    return [int(text) for f in files if f.exists() and (text := f.read_text())]


def wait_markers(marker: Path, n: int, timeout: float = 90.0) -> list[int]:
    """Wait for ``marker.0`` .. ``marker.<n-1>`` and return the pids written in them."""
    deadline = time.monotonic() + timeout
    files = [Path(f"{marker}.{i}") for i in range(n)]
    while time.monotonic() < deadline:
        pids = marker_pids(marker, n)
        if len(pids) == n:
            return pids
        time.sleep(0.1)
    raise TimeoutError(f"ranks did not start within {timeout}s: {[f.name for f in files if not f.exists()]}")


def default_sigint() -> None:
    """A ``preexec_fn``: SIGINT at its default, as in a terminal's foreground job. A shell without job
    control starts its background jobs with SIGINT ignored, and a process keeps it ignored (Python
    too): a test that sends SIGINT must not depend on how the test command itself was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without launcher variables, plus ``extra``."""
    drop = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("SLURM_", "OMPI_", "PMI"))}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_py(args: Sequence[str], timeout: float = 180.0, **kw: object) -> subprocess.CompletedProcess[str]:
    """Run ``python args...`` with this interpreter, capturing text output."""
    env = kw.pop("env", None) or clean_env()
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, check=False, env=env, **kw
    )  # type: ignore[call-overload, no-any-return]


def run_session(args: Sequence[str], timeout: float, **kw: Any) -> tuple[subprocess.CompletedProcess[str], bool]:
    """Run ``args`` in a session of its own, capturing text output; return the run and whether it
    timed out. Whatever of the session still runs afterwards (a launcher's ranks) is SIGKILLed."""
    kw = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kw}
    proc = subprocess.Popen(list(args), text=True, start_new_session=True, **kw)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(list(args), proc.returncode, out, err), timed_out


def json_reports(text: str, marker: str = "") -> list[Any]:
    """Every JSON value printed after ``marker`` in ``text`` (``marker=""``: every object).

    Ranks that share a stdout (mpirun, torch_xla.launch) can merge two reports on one line,
    so this decodes each value where it starts rather than one per line.
    """
    decoder = json.JSONDecoder()
    found: list[Any] = []
    start = marker or "{"
    pos = text.find(start)
    while pos != -1:
        value, end = decoder.raw_decode(text, pos + len(marker))
        found.append(value)
        pos = text.find(start, end)
    return found


def run_together(
    cmds: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]], timeout: float
) -> list[subprocess.CompletedProcess[str]]:
    """Start every command at once (peers of one job), wait for all; none outlives the call."""
    procs = [
        subprocess.Popen(list(cmd), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cmd, env in zip(cmds, envs, strict=True)
    ]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return [
        subprocess.CompletedProcess(p.args, p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)
    ]


def installed(package: str) -> bool:
    """Whether ``package`` is really installed (a test folder of that name on sys.path, which
    looks like a namespace package, does not count)."""
    spec = importlib.util.find_spec(package)
    return spec is not None and spec.origin is not None


def imported_after(module: str, package: str) -> list[str]:
    """The modules of ``package`` that a fresh interpreter has after ``import idist, <module>``."""
    code = f"import sys, idist, {module}\nprint(sorted(m for m in sys.modules if m.split('.')[0] == {package!r}))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    found: list[str] = json.loads(out.stdout.strip().splitlines()[-1].replace("'", '"'))
    return found
