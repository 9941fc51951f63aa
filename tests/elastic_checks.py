"""What the elastic tests check, in one place (loopback launches, functions and namespaces alike).

Every elastic job trains ``elastic_fns.train``; it must end with the parameters of the uninterrupted
run (``reference``, computed once per process, serially, in this process). Rank 0 of each attempt
leaves ``OUT/attempt<R>-world<W>-from<STEP>``; a stalled rank leaves its pid in ``OUT/stalled-rank<N>``.
"""

from __future__ import annotations

import functools
import socket
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

import elastic_fns
import idist
from multiproc import free_port as free_port  # this worker's own range, below the ephemeral ports


@functools.cache
def reference() -> dict[str, torch.Tensor]:
    """The parameters of the uninterrupted run (one process, serial: global batches make N ranks train like one)."""
    with tempfile.TemporaryDirectory(prefix="elastic-reference-") as out:
        idist.initialize()
        try:
            return elastic_fns.train(0, out)
        finally:
            idist.finalize()


def same_model(finals: Sequence[dict[str, torch.Tensor]], strategies: Sequence[str] = ("",)) -> None:
    """Each of ``finals`` (at least one) holds the reference's parameters, within float32 rounding: once
    per trained strategy, its keys prefixed ``<strategy>/`` (``elastic_fns.train(strategy="ddp,fsdp")``)."""
    assert finals, "no final parameters"
    for final in finals:
        prefixes = [f"{s}/" if s else "" for s in strategies]
        assert final.keys() == {p + key for p in prefixes for key in reference()}, final.keys()
        for prefix in prefixes:
            for key, value in reference().items():
                torch.testing.assert_close(final[prefix + key], value, rtol=1e-5, atol=1e-6, msg=prefix + key)


def finals(out: Path, count: int) -> list[dict[str, torch.Tensor]]:
    """The ``count`` final parameters files in ``out`` (``final.pt``: idist run's rank 0; ``final-PID.pt``:
    each spawn node that ended well)."""
    paths = sorted(out.glob("final*.pt"))
    assert len(paths) == count, paths
    return [torch.load(path) for path in paths]


def attempts(out: Path) -> list[str]:
    """The attempts the job made, in name order: ``attempt<R>-world<W>-from<STEP>``."""
    return sorted(p.name for p in out.glob("attempt*"))


def listening(port: int, timeout: float = 60.0) -> None:
    """Wait until the rendezvous store listens on ``port`` of loopback: the node started first hosts it
    (on one machine either node could; across machines the one that owns the address does), and a
    lost host ends the job."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout}s")


def stalled(out: Path, n: int, timeout: float = 90.0) -> list[int]:
    """The pids in ``out``'s stalled-rank files, once ``n`` ranks have written theirs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(out.glob("stalled-rank*"))
        if len(found) >= n and all(f.read_text() for f in found):
            return [int(f.read_text()) for f in found]
        time.sleep(0.1)
    raise TimeoutError(f"{n} ranks did not stall within {timeout}s")
