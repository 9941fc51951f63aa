"""``idist run`` as a Unix tool: pipes that close, slow readers, progress bars, terminals, debuggers,
and nothing left running however the job ends. The ranks are plain Python (tests/launch_scripts/
unix_rank.py): each starts in milliseconds, so these tests cost the launcher's start and little else."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch_util import SCRIPTS, alive, clean_env, default_sigint, marker_pids, wait_gone, wait_markers

pytestmark = pytest.mark.timeout(300)
RANK = str(SCRIPTS / "unix_rank.py")
RUN = [sys.executable, "-m", "idist", "run"]


def _pids(mark: Path, name: str, ranks: int = 2) -> list[int]:
    return [int(Path(f"{mark}.{r}.{name}").read_text()) for r in range(ranks)]


def _read_until(fd: int, want: bytes, seconds: float) -> bytes:
    """What ``fd`` gives until ``want`` appears in it (or its end, or ``seconds``)."""
    got = b""
    deadline = time.monotonic() + seconds
    while want not in got and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # a pty's master once the other side closed
                break
            if not data:
                break
            got += data
    return got


def _wait_file(path: Path, proc: subprocess.Popen[bytes] | subprocess.Popen[str], seconds: float = 120) -> None:
    """Wait until a rank wrote ``path`` (failing at once if the launcher ended first)."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, f"no {path.name} (launcher: {proc.returncode})"
        time.sleep(0.02)


def _sweepers_of(pid: int) -> list[int]:
    """The sweepers (launch/_sessions.py run as a script) still running for launcher ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"_sessions.py") for a in argv) and str(pid).encode() in argv:
            found.append(int(entry.name))
    return found


def test_a_closed_reader_ends_the_job_like_python_piped_to_head(tmp_path: Path) -> None:
    forever = tmp_path / "forever.py"
    forever.write_text("import itertools\nfor i in itertools.count():\n    print('tick', i, flush=True)\n")
    line = f"{' '.join(RUN)} -n 2 {forever} | head -2; echo status ${{PIPESTATUS[0]}}"
    proc = subprocess.Popen(["bash", "-c", line], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(), start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the pipeline, should the launcher hang
        proc.wait()
    out = stdout.splitlines()
    assert len(out) == 3 and all(re.fullmatch(r"\[rank[01]\]:tick \d+", x) for x in out[:2]), stdout
    assert out[-1] == "status 141", (stdout, stderr[-2000:])
    assert "Traceback" not in stderr, stderr[-2000:]


def test_a_slow_reader_gets_every_line_and_the_launcher_waits_for_it(tmp_path: Path) -> None:
    mark = tmp_path / "m"
    r, w = os.pipe()
    # 120 KB: more than the pipe to the reader holds, less than the pipes from the rank hold
    proc = subprocess.Popen([*RUN, "-n", "1", RANK, "burst", str(mark), "1500"], stdout=w, env=clean_env())
    os.close(w)
    try:
        _wait_file(Path(f"{mark}.0.done"), proc)
        # The reader stalls well past the moment the rank exited: the launcher must wait for it.
        time.sleep(5.5)
        assert proc.poll() is None, "the launcher exited while its output was still unread"
        with os.fdopen(r, "rb") as reader:
            lines = reader.read().decode().splitlines()
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        proc.wait()
    assert len(lines) == 1501 and lines[-1] == "[rank0]:LAST LINE 0", lines[-3:]
    assert lines[:-1] == [f"[rank0]:line {i:06d} of rank 0 " + "x" * 58 for i in range(1500)]


def test_progress_lines_pass_through_as_they_come(tmp_path: Path) -> None:
    mark = tmp_path / "m"
    proc = subprocess.Popen([*RUN, "-n", "1", RANK, "progress", str(mark)], stderr=subprocess.PIPE, env=clean_env())
    assert proc.stderr is not None
    try:
        seen = _read_until(proc.stderr.fileno(), b"step 1", 120)
        assert b"[rank0]:step 1" in seen, seen
        Path(f"{mark}.go").touch()
        rest = proc.stderr.read()
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        proc.wait()
    assert (seen + rest).startswith(b"\r[rank0]:step 1\r[rank0]:step 2\n"), seen + rest


def test_a_line_printed_in_pieces_stays_whole(tmp_path: Path) -> None:
    proc = subprocess.run([*RUN, "-n", "2", RANK, "pieces", str(tmp_path / "m")], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120, env=clean_env(), check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["[rank1]:a line of rank 1", "[rank0]:first half, second half"], proc.stdout


def test_with_stdout_closed_the_job_runs_and_ends_cleanly(tmp_path: Path) -> None:
    mark = tmp_path / "m"
    proc = subprocess.run(
        ["bash", "-c", '"$@" >&-', "-", *RUN, "-n", "2", RANK, "burst", str(mark), "10"],
        capture_output=True, text=True, timeout=120, env=clean_env(), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr[-3000:]


def test_every_child_of_a_rank_ends_with_the_job_but_a_detached_one(tmp_path: Path) -> None:
    """A rank that exits 0 and one that raises both leave a background child: the job ends them
    (and adopts and reaps them meanwhile); a child started in a session of its own is left, and
    does not hold the launcher up though it keeps the rank's stdout open."""
    mark = tmp_path / "m"
    proc = subprocess.Popen([*RUN, "-n", "2", RANK, "children", str(mark)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env())  # fmt: skip
    try:
        _wait_file(Path(f"{mark}.1.child"), proc)
        _wait_file(Path(f"{mark}.0.detached"), proc)
        assert wait_gone([int(Path(f"{mark}.0").read_text())], timeout=60) == []
        # rank 0 is gone: the launcher adopted its child (a subreaper), init did not
        orphan = int(Path(f"{mark}.0.child").read_text())
        assert Path(f"/proc/{orphan}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(proc.pid)
        Path(f"{mark}.go").touch()
        started = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - started
        children = _pids(mark, "child")
        detached = int(Path(f"{mark}.0.detached").read_text())
        assert proc.returncode == 1, err[-3000:]
        assert "idist run: rank 1 (local rank 1) exited with code 1" in err, err[-3000:]
        assert wait_gone(children, timeout=1.0) == []
        assert alive(detached)  # detached on purpose: not the job's
        assert took < 4.0, took  # the 3 s grace is not needed, nor a wait for the detached one's stdout
    finally:
        proc.kill()
        proc.wait()
        for name in ("detached", "child"):
            for f in tmp_path.glob(f"m.*.{name}"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(f.read_text()), signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_a_launcher_stopped_by_a_signal_leaves_nothing_running(tmp_path: Path, sig: signal.Signals) -> None:
    mark = tmp_path / "m"
    proc = subprocess.Popen([*RUN, "-n", "2", RANK, "sleepers", str(mark)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=clean_env(), preexec_fn=default_sigint)  # fmt: skip
    try:
        ranks = wait_markers(mark, 2, timeout=120)
        _wait_file(Path(f"{mark}.1.child"), proc)
        _wait_file(Path(f"{mark}.0.child"), proc)
        children = _pids(mark, "child")
        proc.send_signal(sig)
        code = proc.wait(30)
        start = time.monotonic()
        assert code == (-sig if sig == signal.SIGKILL else 128 + sig), code
        assert wait_gone(ranks, timeout=5.0) == [], marker_pids(mark, 2)
        if sig == signal.SIGKILL:  # a launcher killed outright takes every rank with it within a second
            assert time.monotonic() - start < 1.0
        assert wait_gone(children, timeout=5.0) == []
        assert wait_gone(_sweepers_of(proc.pid), timeout=5.0) == []
    finally:
        proc.kill()
        proc.wait()


def test_rank_0_reads_stdin_from_a_pipe_and_the_others_dev_null(tmp_path: Path) -> None:
    proc = subprocess.run([*RUN, "-n", "2", RANK, "stdin", str(tmp_path / "m")], input="alice\n",
                          capture_output=True, text=True, timeout=120, env=clean_env(), check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = set(proc.stdout.splitlines())
    assert {"[rank0]:rank 0 stdin: a pipe or file", "[rank1]:rank 1 stdin: /dev/null"} <= lines, proc.stdout
    assert "[rank0]:name? hello alice" in lines, proc.stdout


@contextlib.contextmanager
def _under_a_terminal(cmd: list[str]) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``cmd`` as the foreground job of a new terminal (a pty whose master the test holds)."""
    master, slave = os.openpty()

    def take_terminal() -> None:
        default_sigint()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                            preexec_fn=take_terminal, env=clean_env())  # fmt: skip
    os.close(slave)
    try:
        yield proc, master
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        os.close(master)


def test_input_on_rank_0_under_a_terminal(tmp_path: Path) -> None:
    with _under_a_terminal([*RUN, "-n", "2", RANK, "stdin", str(tmp_path / "m")]) as (proc, tty):
        seen = _read_until(tty, b"name? ", 120)
        assert b"[rank0]:rank 0 stdin: terminal" in seen and b"[rank1]:rank 1 stdin: /dev/null" in seen, seen
        os.write(tty, b"alice\n")
        seen += _read_until(tty, b"hello alice", 60)
        # the prompt, the terminal's echo of what was typed, then the rank's next line, prefixed again
        assert b"[rank0]:name? alice\r\n[rank0]:hello alice\r\n" in seen, seen
        assert proc.wait(60) == 0


@pytest.mark.parametrize("pdb_rank", [None, 1])
def test_breakpoint_stops_one_rank_under_a_terminal(tmp_path: Path, pdb_rank: int | None) -> None:
    """``breakpoint()`` on every rank: rank 0 (or ``--pdb-rank R``) stops in pdb, the others skip it."""
    flag = [] if pdb_rank is None else ["--pdb-rank", str(pdb_rank)]
    debugged = pdb_rank or 0
    with _under_a_terminal([*RUN, "-n", "2", *flag, RANK, "pdb", str(tmp_path / "m")]) as (proc, tty):
        seen = _read_until(tty, b"(Pdb) ", 120)
        assert f"[rank{debugged}]:(Pdb) ".encode() in seen, seen
        os.write(tty, b"p x * 7\n")
        seen += _read_until(tty, str((6 + debugged) * 7).encode(), 60)
        os.write(tty, b"c\n")
        seen += _read_until(tty, f"after {debugged}".encode(), 60)
        assert proc.wait(60) == 0, seen
        seen += _read_until(tty, b"(the rest, up to the terminal's end)", 5)
        text = seen.decode()
        assert f"[rank{debugged}]:{(6 + debugged) * 7}" in text and f"[rank{1 - debugged}]:after {1 - debugged}" in text
        assert f"[rank{1 - debugged}]:(Pdb)" not in text, text  # the other rank skipped its breakpoint()


def test_pdb_rank_debugs_an_uncaught_exception_while_the_others_are_stopped(tmp_path: Path) -> None:
    """``--pdb-rank 1``: rank 1 reads stdin (here a pipe), opens pdb on its uncaught exception, and the
    launcher waits for it although rank 0 failed first (and was reported, and its rank stopped)."""
    proc = subprocess.run([*RUN, "-n", "2", "--pdb-rank", "1", RANK, "raise", str(tmp_path / "m")],
                          input="p x * 2\nq\n", capture_output=True, text=True, timeout=120, env=clean_env(),
                          check=False)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "[rank1]:(Pdb) 12" in proc.stdout, proc.stdout
    assert (
        "idist run: rank 0 (local rank 0) exited with code 1; stopping the others but the debugged rank" in proc.stderr
    )
    assert "[rank1]:ValueError: rank 1 fails" in proc.stderr and "_pdb_rank.py" not in proc.stderr, proc.stderr
