"""What the ranks do in the namespace tests; run on a node as ``python netns_job.py MODE OUT [options]``.

Modes (each rank writes ``OUT/<tag>rank<R>.json``; a rank that fails writes ``OUT/<tag>rank<R>.err.json``
with the exception type, message and the wall time it was raised at):

* ``env``: started by ``idist run`` / torchrun: ``idist.initialize()`` from the launcher's variables.
* ``spawn``: ``idist.spawn(rank_main, nprocs=2, nnodes=N, node_rank=i, master_addr=A, master_port=P)``.
* ``parallel``: ``idist.Parallel(backend="gloo", nproc_per_node=2, nnodes=N, node_rank=i, ...)``.

``--work``: ``checks`` (collectives + topology + training equivalence), ``loop`` (all_reduce in a
loop, a heartbeat file per rank, until the test breaks something; ``--section S`` bounds each call
with ``ctx.timeout(S)``), ``ddp`` (the same loop as DDP training steps that call no idist function:
only torch's own collectives wait) or ``slow`` (rank 2 computes for ``--slow S`` seconds between
two all_reduces while the others wait in the second).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import torch  # noqa: E402

import idist  # noqa: E402


def _ss() -> dict[str, list[str]]:
    """This node's TCP listeners and established connections, as ``ss`` shows them.

    ``ss`` reads the owners from /proc before it reads the sockets, so a socket that another job
    on the node opens in between shows no ``pid=``: such a table is read again (a few times)."""
    out = {}
    for what, flags in (("listen", "-Htlnp"), ("established", "-Htnp")):
        for _ in range(5):
            r = subprocess.run(["ss", flags], capture_output=True, text=True, timeout=10)
            out[what] = [" ".join(line.split()[3:]) for line in r.stdout.splitlines()]
            if all("pid=" in line for line in out[what]):
                break
            time.sleep(0.2)
    return out


def training_cases(world_size: int) -> list[tuple[int, bool]]:
    """test_training_gloo's cases that are valid at this world size (its tail-of-2 case is a 2-rank
    case: at 4 ranks some ranks would run one step more, which DDP cannot train), plus that case's
    analogue here: a tail of one sample per rank."""
    from test_training_gloo import CASES, B

    valid = [(n, d) for n, d in CASES if d or n % B % world_size == 0]
    return [*valid, (B * 8 + world_size, False)]


def checks(ctx: idist.DistContext, training: bool) -> dict[str, Any]:
    r, w = ctx.rank, ctx.world_size
    res: dict[str, Any] = {
        "rank": r, "world_size": w, "local_rank": ctx.local_rank, "node_rank": ctx.node_rank,
        "nnodes": ctx.nnodes, "nproc_per_node": ctx.nproc_per_node, "hostname": socket.gethostname(),
        "hostname_addr": socket.gethostbyname(socket.gethostname()),
        "module": [idist.get_rank(), idist.get_local_rank(), idist.get_node_rank(), idist.get_nnodes(),
                   idist.get_nproc_per_node(), idist.get_world_size()],
        "config": {k: str(v) for k, v in ctx.config.items()},
        "pid": os.getpid(),
    }  # fmt: skip
    res["sum_int"] = ctx.all_reduce(r + 1)
    t = torch.tensor([r, 2**40 + r], dtype=torch.int64)
    ctx.all_reduce(t)
    res["sum_tensor"] = t.tolist()
    res["max_float"] = ctx.all_reduce(0.5 * r, "MAX")
    res["sum_float"] = ctx.all_reduce(0.1 * (r + 1))
    res["gather_int"] = ctx.all_gather(r)
    res["gather_str"] = ctx.all_gather(f"{socket.gethostname()}/{ctx.local_rank}")
    res["gather_ragged"] = [x.tolist() for x in ctx.all_gather(torch.arange(r + 1, dtype=torch.float32))]
    res["bcast_tensor"] = ctx.broadcast(torch.full((3,), float(r)), src=w - 1).tolist()
    res["bcast_str"] = ctx.broadcast(f"from {r}" if r == 2 else None, src=2)
    res["group_12"] = ctx.all_reduce(r + 1, group=[1, 2])  # one rank of each node
    g = ctx.new_group([0, w - 1])
    res["group_0_last"] = ctx.all_gather(r, group=g)
    ctx.barrier()
    if ctx.local_rank == 0:
        res["ss"] = _ss()  # every rank of this node has its gloo listener up by now
    ctx.barrier()
    if training:
        from test_training_gloo import EPOCHS, B
        from training_cases import train

        res["training"] = {f"{n}-{d}": train(ctx, n, B, EPOCHS, drop_last=d) for n, d in training_cases(w)}
    return res


#: seconds a looping rank rests between two steps: it spends most of a test waiting for a fault
#: (or for the jobs beside it to start), and a busy loop would take the CPU they start with
PACE = 0.1


def loop(ctx: idist.DistContext, out: Path, tag: str, section: float | None) -> dict[str, Any]:
    """all_reduce forever, a heartbeat per iteration: the test pulls a link or kills a node meanwhile."""
    beat = out / f"{tag}beat{ctx.rank}"
    t = torch.ones(1 << 16)
    i = 0
    while True:
        if section is None:
            ctx.all_reduce(t)
        else:
            with ctx.timeout(section):
                ctx.all_reduce(t)
        i += 1
        tmp = beat.with_suffix(".tmp")
        tmp.write_text(f"{i} {time.time()}")
        tmp.replace(beat)  # readers never see a half-written beat
        time.sleep(PACE)


def ddp_loop(ctx: idist.DistContext, out: Path, tag: str) -> dict[str, Any]:
    """DDP training steps forever, a heartbeat file per step; no idist call inside the loop."""
    torch.manual_seed(0)
    model = ctx.auto_model(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    beat = out / f"{tag}beat{ctx.rank}"
    x = torch.randn(8, 64)
    i = 0
    while True:
        opt.zero_grad()
        model(x).sum().backward()  # DDP's gradient all_reduce waits inside backward
        opt.step()
        i += 1
        tmp = beat.with_suffix(".tmp")
        tmp.write_text(f"{i} {time.time()}")
        tmp.replace(beat)
        time.sleep(PACE)


def slow(ctx: idist.DistContext, seconds: float) -> dict[str, Any]:
    """Rank 2 computes (Python and a sleep) while the others wait for it inside a collective."""
    first = ctx.all_reduce(ctx.rank)
    start = time.monotonic()
    if ctx.rank == 2:
        end = start + seconds / 2
        while time.monotonic() < end:
            pass
        time.sleep(seconds / 2)
    second = ctx.all_reduce(torch.full((3,), float(ctx.rank)))
    return {"first": first, "second": second.tolist(), "waited": time.monotonic() - start, "after": ctx.all_gather(1)}


def _record(out: Path, tag: str, rank: int, fn: Any, *args: Any) -> Any:
    try:
        res = fn(*args)
    except BaseException as e:
        err = {
            "rank": rank, "type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
            "message": str(e)[:4000], "time": time.time(), "traceback": traceback.format_exc()[-4000:],
        }  # fmt: skip
        (out / f"{tag}rank{rank}.err.json").write_text(json.dumps(err))
        raise
    (out / f"{tag}rank{rank}.json").write_text(json.dumps(res))
    return res


def _body(ctx: idist.DistContext, a: argparse.Namespace) -> Any:
    out = Path(a.out)
    (out / f"{a.tag}pid{ctx.rank}").write_text(str(os.getpid()))
    if a.work == "checks":
        return checks(ctx, a.training)
    if a.work == "slow":
        return slow(ctx, a.slow)
    if a.work == "ddp":
        return ddp_loop(ctx, out, a.tag)
    return loop(ctx, out, a.tag, a.section)


def rank_main(local_rank: int, a: argparse.Namespace) -> str:
    """spawn's torch.multiprocessing form: initialize() from the variables spawn set, finalize at the end."""
    rank = int(os.environ.get("RANK", "-1"))

    def run() -> Any:
        ctx = idist.initialize("gloo", timeout=a.timeout)
        try:
            return _body(ctx, a)
        finally:
            idist.finalize()

    _record(Path(a.out), a.tag, rank, run)
    return "ok"


def parallel_main(local_rank: int, a: argparse.Namespace) -> str:
    """Parallel.run's fn: the context is already initialized around it."""
    ctx = idist.current()
    _record(Path(a.out), a.tag, ctx.rank, _body, ctx, a)
    return "ok"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["env", "spawn", "parallel"])
    p.add_argument("out")
    p.add_argument("--work", choices=["checks", "loop", "ddp", "slow"], default="checks")
    p.add_argument("--slow", type=float, default=10.0, help="--work slow: seconds rank 2 computes")
    p.add_argument("--training", action="store_true")
    p.add_argument("--tag", default="")
    p.add_argument("--section", type=float, default=None)
    p.add_argument("--timeout", type=float, default=None, help="the process group's timeout (initialize)")
    p.add_argument("--nnodes", type=int, default=2)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default=None)
    p.add_argument("--master-port", type=int, default=None)
    a = p.parse_args()
    t0 = time.time()
    try:
        if a.mode == "env":
            rank_main(int(os.environ.get("LOCAL_RANK", "0")), a)
        elif a.mode == "spawn":
            idist.spawn(
                rank_main, args=(a,), nprocs=2, nnodes=a.nnodes, node_rank=a.node_rank,
                master_addr=a.master_addr, master_port=a.master_port,
            )  # fmt: skip
        else:
            kw: dict[str, Any] = {"timeout": a.timeout} if a.timeout else {}
            with idist.Parallel(
                backend="gloo", nproc_per_node=2, nnodes=a.nnodes, node_rank=a.node_rank,
                master_addr=a.master_addr, master_port=a.master_port, **kw,
            ) as par:  # fmt: skip
                par.run(parallel_main, a)
    except BaseException as e:
        print(f"LAUNCHER-ERROR {type(e).__name__} after {time.time() - t0:.1f}s: {e}", flush=True)
        raise
    print(f"LAUNCHER-OK after {time.time() - t0:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
