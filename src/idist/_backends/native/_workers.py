"""gloo's worker threads, settled before the interpreter finalizes.

The worker that ran a collective destroys its work object a moment after ``wait()`` returned,
and with it a copy of the caller's thread-local state: Python objects (the context torch keeps
for the length of every backward, so every collective DDP or FSDP runs; saved-tensor hooks;
torch-function modes) whose release needs the GIL. A worker that asks for the GIL once the
interpreter finalizes ends in ``std::terminate`` (SIGABRT). So the last exit hook waits,
without the GIL, until every gloo worker is asleep with no context switch over a poll: idle,
or stuck in a collective that no wait can end. See docs/design.md, "Clean exit".
"""

from __future__ import annotations

import os
import time

#: the name torch gives each gloo worker thread (``ProcessGroupGloo::runLoop``)
WORKER = "pt_gloo_runloop"
#: seconds between two looks (the GIL is free meanwhile)
POLL = 0.002
#: how long exiting waits for workers that keep running (a collective still under way)
SETTLE_SECONDS = 2.0

_TASKS = "/proc/self/task"


def _snapshot() -> dict[str, tuple[str, int]]:
    """Each gloo worker thread of this process: its scheduler state and context switches."""
    try:
        tids = os.listdir(_TASKS)
    except OSError:  # no procfs: nothing to look at
        return {}
    found: dict[str, tuple[str, int]] = {}
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/comm") as f:
                if f.read().strip() != WORKER:
                    continue
            with open(f"{_TASKS}/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"{_TASKS}/{tid}/status") as f:
                switches = sum(int(line.split()[1]) for line in f if line.split(":")[0].endswith("ctxt_switches"))
        except (OSError, IndexError, ValueError):  # the thread ended meanwhile
            continue
        found[tid] = (state, switches)
    return found


def settle(seconds: float = SETTLE_SECONDS) -> None:
    """Return once every gloo worker stayed asleep, without a context switch, over one poll."""
    deadline = time.monotonic() + seconds
    before = _snapshot()
    while before:
        time.sleep(POLL)  # a worker waiting for the GIL takes it now
        now = _snapshot()
        if all(state == "S" and before.get(tid) == (state, n) for tid, (state, n) in now.items()):
            return
        if time.monotonic() >= deadline:
            return
        before = now
