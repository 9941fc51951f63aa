"""The ``idist`` command: ``idist run`` starts a script on N ranks, ``idist info`` reports.

``idist run -n N [options] script.py [args...]`` (or ``-m module``): its flags and their
checks are ``launch/_command``'s, the launch ``launch/_scripts``' (output lines prefixed with
the global rank; the exit status is the first failed rank's, 128 + N for signal N); Horovod
jobs go through ``horovodrun`` (``launch/_hvd_cli``).
``idist info`` prints the backends, the launcher environment, the interface and devices;
``idist checkpoint info|convert DIR`` inspects a checkpoint folder (``checkpoint/_inspect``)
without running code from it (``convert --trust`` does, for checkpoints the user trusts).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Sequence
from typing import NoReturn

from .launch import _command

#: Status for a command line that cannot work (as argparse uses).
USAGE_ERROR = _command.USAGE_ERROR


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors (the subcommands' too) begin ``idist: error:``."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(USAGE_ERROR, f"idist: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="idist", description="Launch and inspect idist distributed jobs.", allow_abbrev=False)
    sub = p.add_subparsers(dest="command", required=True)
    _command.add_parser(sub)
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


def cmd_run(a: argparse.Namespace) -> int:
    try:
        return _command.run(a)
    except _command.UsageError as exc:
        return _fail(str(exc))


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
