"""Run a function on N real Horovod ranks (horovodrun, gloo, loopback) with a hard timeout.

``hvdrun("cases_x:fn", 2, *args)`` starts ``horovodrun -np 2 -H localhost:2 --gloo`` on
``_worker.py``, which calls ``fn(*args)`` in each rank (args travel as JSON), and returns
the results in rank order. A rank that raised fails the call with its traceback
(``RankFailed``); a run past ``timeout`` kills the whole process group and raises
``TimeoutError``. Nothing is left behind: the result folder is removed, the launcher runs
in its own session and is killed with everything it started.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from launch_util import run_session

HERE = Path(__file__).resolve().parent
HOROVODRUN = Path(sys.executable).parent / "horovodrun"


class RankFailed(AssertionError):
    def __init__(self, rank: int, tb: str, output: str) -> None:
        super().__init__(f"rank {rank} failed:\n{tb}\n--- launcher output ---\n{output[-4000:]}")
        self.rank = rank
        self.tb = tb
        self.output = output


def hvdrun(
    target: str, np: int = 2, *args: Any, timeout: float = 120.0, env: dict[str, str] | None = None
) -> list[Any]:
    """Results of ``target(*args)`` on ``np`` Horovod ranks, in rank order."""
    return run_raw(target, np, *args, timeout=timeout, env=env).results


class RunOutcome:
    def __init__(self, returncode: int, output: str, out_dir: Path, np: int, elapsed: float) -> None:
        self.returncode = returncode
        self.output = output
        self.elapsed = elapsed
        self.np = np
        self.errors = {
            r: (out_dir / f"rank{r}.err").read_text() for r in range(np) if (out_dir / f"rank{r}.err").exists()
        }
        self.done = {
            r: pickle.loads((out_dir / f"rank{r}.pkl").read_bytes())
            for r in range(np)
            if (out_dir / f"rank{r}.pkl").exists()
        }

    @property
    def results(self) -> list[Any]:
        if self.errors:
            rank = min(self.errors)
            raise RankFailed(rank, self.errors[rank], self.output)
        if self.returncode != 0 or len(self.done) != self.np:
            raise RankFailed(
                -1, f"horovodrun exited with {self.returncode}, results from {sorted(self.done)}", self.output
            )
        return [self.done[r] for r in range(self.np)]


def run_raw(
    target: str, np: int = 2, *args: Any, timeout: float = 120.0, env: dict[str, str] | None = None
) -> RunOutcome:
    """Run and collect everything (for tests that expect a failure)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), str(HERE.parent), full_env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="idist-hvd-") as tmp:
        out = Path(tmp)
        cmd = [
            str(HOROVODRUN), "-np", str(np), "-H", f"localhost:{np}", "--gloo", "--disable-cache",
            "--gloo-timeout-seconds", "60", "--start-timeout", "60",
            sys.executable, str(HERE / "_worker.py"), str(out), target, json.dumps(list(args)),
        ]  # fmt: skip
        start = time.monotonic()
        # horovodrun's ranks live in its session: nothing of it survives the call
        proc, timed_out = run_session(cmd, timeout, stderr=subprocess.STDOUT, env=full_env, cwd=tmp)
        output = proc.stdout
        if timed_out:
            raise TimeoutError(f"horovodrun {target} did not finish within {timeout}s:\n{output[-4000:]}")
        return RunOutcome(proc.returncode, output, out, np, time.monotonic() - start)
