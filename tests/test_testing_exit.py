"""A simulated run ends whatever its ranks do, Ctrl-C stops it, and the process exits right
after: checked in a fresh interpreter, so that a hang, a signal or a slow exit fails the test
instead of the suite."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from launch_util import clean_env, default_sigint

#: 1. ranks that share one DDP model (what share_args allows): each run must end;
#: 2. a run that times out while a rank sleeps in C code (the thread outlives the run);
#: 3. a rank spinning in Python while another waits in a collective, no timeout: Ctrl-C
_CHILD = r"""
import inspect, math, time, torch, idist
from idist.testing import RankFailedError, WorldTimeoutError, simulate

def step(ctx, model):
    ddp = ctx.auto_model(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(5):
        ddp(torch.ones(4, 8)).sum().backward()
        opt.step()
    return ctx.rank

share = {"share_args": True} if "share_args" in inspect.signature(simulate).parameters else {}
for i in range(2):
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(4)])
    try:
        simulate(2, step, model, timeout=2, **share)
        print("shared run", i, "returned", flush=True)
    except (RankFailedError, WorldTimeoutError) as exc:
        print("shared run", i, "raised", type(exc).__name__, flush=True)

def asleep(ctx):
    if ctx.rank == 1:
        time.sleep(120)
    return ctx.all_reduce(1)

try:
    simulate(2, asleep, timeout=4)
except WorldTimeoutError:
    print("timed out", flush=True)

def spin(ctx):
    if ctx.rank == 1:
        print("spinning", flush=True)
        while True:
            pass
    return ctx.all_reduce(1)

simulate(2, spin, timeout=math.inf if share else 600)
"""


def test_runs_end_whatever_the_ranks_do_ctrl_c_stops_them_and_exit_is_prompt() -> None:
    # it is sent SIGINT: at its default, even when the test command runs as a background job
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
        preexec_fn=default_sigint,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        while not lines or lines[-1] != "spinning":
            line = proc.stdout.readline()
            assert line, (lines, proc.wait(), proc.stderr.read() if proc.stderr else "")
            lines.append(line.strip())
        time.sleep(0.3)
        interrupted = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        exited = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [line.split()[:2] for line in lines[:2]] == [["shared", "run"]] * 2, lines  # both ended
    assert lines[2] == "timed out", lines
    assert "KeyboardInterrupt" in err, err[-3000:]
    assert proc.returncode not in (0, -signal.SIGABRT, -signal.SIGSEGV), (proc.returncode, err[-3000:])
    # the rank asleep since the timed-out run is still alive (116 s more): exit waits for it a
    # moment only (EXIT_GRACE, 1 s). About 2 s here when quiet, 11 s seen with both xdist workers
    # and other work on 2 cores: the bound tells a prompt exit from a join on the sleeper.
    print(f"exit took {exited - interrupted:.2f}s after Ctrl-C")
    assert exited - interrupted < 40.0, exited - interrupted
