"""What a failed checkpoint step gathers, and what a load asks the filesystem, as the world grows.

    .venv/bin/python benchmarks/probe_scale_reports.py [--ranks 2,4,8,16] [--json OUT]

Simulated ranks (threads, one process), counted, not timed:

- ``gathered``: the largest buffer an all_gather brings to one rank while a load's stateful
  object raises on every rank, with a 1 kB message (``every 1k``), and on one rank with a
  10 MB message (``one 10M``); counted at the native backend's ``allgather_bytes``.
- ``fs``: the ``stat``/``lstat``/``scandir``/``listdir`` calls of one load, in all ranks, of a
  checkpoint with as many data files as ranks (DCP's writer with that many threads), and
  how many of them ask about a data file.

Run it with ``PYTHONPATH=<another checkout>/src`` to count another version of idist.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter

import idist
from idist.testing import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from failing_loads import FailsOnce, counting_gathers, load_failing


def _largest_gather(folder: Path, n: int, messages: dict[int, str]) -> int:
    with pytest.MonkeyPatch.context() as patch:
        sizes = counting_gathers(patch)
        errors = load_failing(folder, n, messages)
    assert all(name == "CheckpointError" for name, _ in errors), "the load did not fail on every rank"
    return max(sizes)


def _model(blocks: int) -> nn.Module:
    return nn.Sequential(*(nn.Linear(4, 4) for _ in range(blocks)))


def _fs_calls(root: Path, n: int) -> tuple[int, int]:
    folder = Path(tempfile.mkdtemp(dir=root)) / "ck"
    model = _model(n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": model.state_dict()}, storage_writer=FileSystemWriter(folder, thread_count=n), no_dist=True)
    seen: list[str] = []
    originals = {name: getattr(os, name) for name in ("stat", "lstat", "scandir", "listdir")}
    for name, original in originals.items():

        def counting(path: Any = ".", *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            seen.append(os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else "")
            return _original(path, *args, **kwargs)

        setattr(os, name, counting)
    try:
        simulate(n, lambda ctx: ctx.load_checkpoint(folder, {"model": _model(n)}))
    finally:
        for name, original in originals.items():
            setattr(os, name, original)
    return len(seen), sum(p.endswith(".distcp") for p in seen)


def main() -> None:
    p = argparse.ArgumentParser(description="What failure reports gather and loads ask, as the world grows")
    p.add_argument("--ranks", default="2,4,8,16")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        idist.save_checkpoint(root / "ck", {"obj": FailsOnce()})
        _fs_calls(root, 1)  # the first load imports what loads need (imports ask the filesystem too)
        for n in (int(x) for x in args.ranks.split(",")):
            every = _largest_gather(root / "ck", n, {r: f"rank {r}: " + "e" * 1024 for r in range(n)})
            one = _largest_gather(root / "ck", n, {n - 1: "x" * (10 * 2**20)})
            calls, data = _fs_calls(root, n)
            rows.append({"N": n, "every_1k": every, "one_10M": one, "fs_calls": calls, "fs_data": data})
    print("| N | gathered, every rank 1 kB | gathered, one rank 10 MB | fs calls (on data files) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['N']} | {r['every_1k']:,} B | {r['one_10M']:,} B | {r['fs_calls']} ({r['fs_data']}) |")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": rows}, indent=1))


if __name__ == "__main__":
    main()
