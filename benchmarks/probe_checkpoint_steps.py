"""What the safety steps of a checkpoint save and load cost, each on its own, in one process.

    .venv/bin/python benchmarks/probe_checkpoint_steps.py [--rounds 21]

The checkpoint is ``bench_sharding.py``'s (10 blocks of ``Linear(1024, 1024)`` and AdamW
state), saved serially into a temporary folder. Each step runs beside what it replaced or
wraps: plain ``pickle.loads`` / ``torch.load`` against the restricted unpickler, the old
staging folder (mkdir, probe, removal) against the new one (lock file and ``flock`` too),
and the checks a save and a load add. Prints medians in µs, interleaved per round.
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def _steps(root: Path) -> tuple[dict[str, Callable[[], object]], str]:
    import torch
    from torch import nn

    import idist
    from idist.checkpoint import _files, _manifest, _publish, _replaceable, _unpickle

    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(1024, 1024), nn.ReLU()) for _ in range(10)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(4, 1024)).sum().backward()
    opt.step()
    ck = root / "ck"
    idist.save_checkpoint(ck, {"model": model, "optim": opt, "epoch": 3})
    _publish.wait_removals()
    meta, values = (ck / ".metadata").read_bytes(), (ck / "idist-values.pt").read_bytes()
    buf = io.BytesIO()
    torch.save((0.9, 0.999), buf)  # one of the small values DCP pickles (an AdamW param group's betas)
    item = buf.getvalue()
    per_load = sum(type(m).__name__ == "BytesStorageMetadata" for m in pickle.loads(meta).state_dict_metadata.values())

    def old_staging() -> None:
        tmp = root / ".ck.idist-tmp"
        tmp.mkdir()
        (tmp / _files.PROBE).write_bytes(b"0" * 32)
        shutil.rmtree(tmp)

    def new_staging() -> None:
        _publish.discard(_publish.stage(root / "ck2", os.urandom(16).hex()))

    def pinned_manifest() -> None:
        with _files.pinned(ck) as via:
            _manifest.token(_manifest.read(via, ck), meta)

    steps: dict[str, Callable[[], object]] = {
        "metadata: pickle.loads": lambda: pickle.loads(meta),
        "metadata: restricted unpickler": lambda: _unpickle.load_metadata(meta, trusted=False),
        "values file: torch.load": lambda: torch.load(io.BytesIO(values), map_location="cpu", weights_only=False),
        "values file: restricted": lambda: _unpickle.load_values(values, trusted=False),
        "one DCP value: torch.load": lambda: torch.load(io.BytesIO(item), weights_only=False),
        "one DCP value: restricted": lambda: _unpickle.load_values(item, trusted=False),
        "save: staging before (mkdir, probe, rmtree)": old_staging,
        "save: staging now (+ lock file, flock)": new_staging,
        "save: what is at the path (_replaceable.check)": lambda: _replaceable.check(ck),
        "load: hold the folder, read the manifest, token": pinned_manifest,
    }
    return steps, f"metadata {len(meta)} B, values file {len(values)} B, DCP values per load {per_load}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=21)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="idist-probe-ckpt-"))
    try:
        steps, facts = _steps(root)
        times: dict[str, list[float]] = {k: [] for k in steps}
        for _ in range(args.rounds):
            for name, fn in steps.items():
                start = time.perf_counter()
                for _ in range(20):
                    fn()
                times[name].append((time.perf_counter() - start) / 20 * 1e6)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{facts}\n\n| step | median |\n|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.0f} µs |")


if __name__ == "__main__":
    main()
