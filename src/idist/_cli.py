"""The ``idist`` command: ``idist run`` starts a script on N ranks, ``idist info`` reports.

``idist run -n N [--nnodes M --node-rank K --master-addr A --master-port P] [--checked]
[--rdzv-timeout S] [--backend gloo|nccl|horovod] script.py [args...]`` (or ``-m module``)
starts the ranks with torchrun's variables (``launch/_scripts``); one node without a port
gets a free loopback one. Output lines are prefixed with the global rank; the exit status
is the first failed rank's (128 + N for signal N). Horovod jobs go through ``horovodrun``.
``idist info`` prints the backends, the launcher environment, the interface and devices;
``idist checkpoint info|convert DIR`` inspects a checkpoint folder (``checkpoint/_inspect``)
without running code from it (``convert --trust`` does, for checkpoints the user trusts).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence

#: Status for a command line that cannot work (as argparse uses).
USAGE_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="idist", description="Launch and inspect idist distributed jobs.", allow_abbrev=False
    )
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run a script on N ranks per node",
        description="Run a script on N ranks per node; each output line is prefixed with its rank.",
        allow_abbrev=False,
    )
    run.add_argument("-n", "--nproc-per-node", "--nprocs", dest="nproc", type=int, default=1, help="ranks per node")
    run.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    run.add_argument("--node-rank", type=int, default=0, help="this node's rank, 0..nnodes-1")
    run.add_argument("--master-addr", default=None, help="rendezvous address (default: loopback)")
    run.add_argument("--master-port", type=int, default=None, help="rendezvous port (default: a free one, 1 node)")
    run.add_argument(
        "--backend",
        default="gloo",
        choices=("gloo", "nccl", "horovod"),
        help="launcher family: gloo/nccl start the ranks here (torchrun's variables), horovod through horovodrun",
    )
    run.add_argument("--checked", action="store_true", help="checked mode in every rank (IDIST_CHECKED=1)")
    run.add_argument(
        "--rdzv-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds the ranks wait for each other to join (default: the process group's timeout)",
    )
    liveness_help = "seconds without a heartbeat after which a rank is lost (default 30; 0 turns it off)"
    run.add_argument("--liveness", type=float, default=None, metavar="S", help=liveness_help)
    run.add_argument("-m", "--module", action="store_true", help="run the target as a module (python -m)")
    run.add_argument("script", help="the script (or module with -m) to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    sub.add_parser("info", help="backends, launcher environment and devices seen from here")
    ckpt = sub.add_parser("checkpoint", help="inspect or convert a checkpoint folder (save_checkpoint's)")
    what = ckpt.add_subparsers(dest="action", required=True)
    show = what.add_parser("info", help="list its entries, keys, dtypes, shapes and plain values")
    show.add_argument("folder", help="the checkpoint folder")
    conv = what.add_parser("convert", help="write its whole, unsharded state as one torch.save file")
    conv.add_argument("folder", help="the checkpoint folder")
    conv.add_argument("out", help="the file to write (e.g. model.pt)")
    trust = "unpickle anything in it, as load_checkpoint(..., weights_only=False): only for checkpoints you trust"
    conv.add_argument("--trust", action="store_true", help=trust)
    return p


def _fail(msg: str) -> int:
    print(f"idist: error: {msg}", file=sys.stderr)
    return USAGE_ERROR


def _exit_status(exitcode: int) -> int:
    return 128 - exitcode if exitcode < 0 else exitcode


def _check_topology(a: argparse.Namespace) -> str | None:
    if a.nproc < 1:
        return f"-n must be at least 1, got {a.nproc}"
    if a.nnodes < 1:
        return f"--nnodes must be at least 1, got {a.nnodes}"
    if not 0 <= a.node_rank < a.nnodes:
        return f"--node-rank {a.node_rank} is outside 0..{a.nnodes - 1}"
    if a.master_port is not None and not 0 < a.master_port < 65536:
        return f"--master-port must be in 1..65535, got {a.master_port}"
    if a.nnodes > 1 and a.master_port is None:
        return (
            f"--nnodes {a.nnodes}: pass the same --master-addr and --master-port on every node "
            "(node rank 0 hosts the rendezvous there)"
        )
    return None


def _run_native(a: argparse.Namespace) -> int:
    # deferred: idist.launch imports torch; `idist --help` and argument errors answer without it
    from ._backends.native._liveness import limit_from  # (see above)
    from .launch._plan import LaunchPlan  # (see above)
    from .launch._scripts import run_script  # (see above)

    plan = LaunchPlan(
        nproc_per_node=a.nproc,
        nnodes=a.nnodes,
        node_rank=a.node_rank,
        master_addr=a.master_addr,
        master_port=a.master_port,
    )
    env = {"IDIST_CHECKED": "1"} if a.checked else {}
    if a.rdzv_timeout is not None:
        env["IDIST_RDZV_TIMEOUT"] = str(a.rdzv_timeout)
    if a.liveness is not None:
        try:  # the ranks' own check, once here rather than an error on every rank
            env["IDIST_LIVENESS"] = repr(limit_from(a.liveness, {}))
        except ValueError as exc:
            return _fail(f"--liveness: {exc}")
    target = ["-m", a.script] if a.module else [a.script]
    node = f", node {a.node_rank}" if a.nnodes > 1 else ""
    return run_script(plan, [*target, *a.args], env, node)


def _run_horovod(a: argparse.Namespace) -> int:
    exe = shutil.which("horovodrun")
    if exe is None:
        return _fail("--backend horovod needs horovodrun on PATH: pip install 'idist[horovod]' (see the README)")
    if a.nnodes != 1:
        return _fail("--backend horovod runs one node here; for several hosts call horovodrun -H host1:N,host2:N")
    target = ["-m", a.script] if a.module else [a.script]
    cmd = [exe, "-np", str(a.nproc), "-H", f"localhost:{a.nproc}", "--gloo", sys.executable, "-u", *target, *a.args]
    proc = subprocess.Popen(cmd)
    try:
        return _exit_status(proc.wait())
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return _exit_status(-signal.SIGINT)


def cmd_run(a: argparse.Namespace) -> int:
    problem = _check_topology(a)
    if problem is not None:
        return _fail(problem)
    if not a.module and not os.path.isfile(a.script):
        return _fail(f"no such script: {a.script!r} (use -m to run a module)")
    if a.backend == "horovod":
        return _run_horovod(a)
    return _run_native(a)


def cmd_info() -> int:
    import torch  # deferred: `idist --help` and argument errors answer without importing torch

    import idist  # (see above)

    from . import _netif  # (see above)
    from ._errors import LaunchEnvironmentError  # (see above: idist's modules import torch)
    from ._launch_env import detect  # (see above)

    print(f"idist {idist.__version__}  torch {torch.__version__}  python {platform.python_version()}")
    print(f"host: {platform.node()}  ({os.cpu_count()} CPUs)")
    print(f"backends available: {', '.join(idist.available_backends())}")
    try:
        info = detect(os.environ)
    except LaunchEnvironmentError as e:
        print(f"launcher: inconsistent environment: {e}")
    else:
        if info is None:
            print("launcher: none detected (initialize() here gives a SerialContext)")
        else:
            print(f"launcher: {info.launcher}")
            t = info.topology
            print(
                f"  rank {t.rank} of {t.world_size}, local rank {t.local_rank} of {t.nproc_per_node}, "
                f"node {t.node_rank} of {t.nnodes}, master {info.master_addr}:{info.master_port}"
            )
            for field, why in info.decided_by.items():
                print(f"  {field}: {why}")
            try:
                bind = _netif.choose_bind(info.master_addr, nnodes=t.nnodes, env=os.environ)
            except _netif.NetifError as e:
                print(f"  interface: cannot choose one: {e}")
            else:
                print(f"  interface: {bind.address} on {bind.interface or 'an unknown interface'} ({bind.reason})")
    horovod = [k for k in ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_HOSTNAME") if k in os.environ]
    if horovod:
        print("horovodrun: " + " ".join(f"{k}={os.environ[k]}" for k in horovod))
    print("devices:")
    print("  cpu")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            print(f"  cuda:{i} {torch.cuda.get_device_name(i)}")
    else:
        print("  cuda: none visible")
    print(f"  xla: {'available' if idist.has_xla_support() else 'not installed'}")
    return 0


def cmd_checkpoint(a: argparse.Namespace) -> int:
    from pathlib import Path  # (with the imports below)

    from ._errors import CheckpointError, CheckpointNotFoundError  # deferred: idist's modules import torch
    from .checkpoint import _inspect  # (see above)

    try:
        if a.action == "info":
            lines, problems = _inspect.info(Path(a.folder))
            print("\n".join(lines), flush=True)
            for problem in problems:  # a file it refused or could not read: one line each, no traceback
                print(f"idist: error: {problem}", file=sys.stderr)
            return 1 if problems else 0
        state = _inspect.convert(Path(a.folder), Path(a.out), a.trust)
        print(f"wrote {a.out}: {', '.join(state)}")
    except CheckpointNotFoundError as exc:
        return _fail(str(exc))
    except CheckpointError as exc:
        print(f"idist: error: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.command == "run":
        return cmd_run(a)
    if a.command == "checkpoint":
        return cmd_checkpoint(a)
    return cmd_info()
