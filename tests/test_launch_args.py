"""``idist run``'s flags: every value that cannot work ends the command with ``idist: error:`` and
status 2, before anything starts (in process: no rank is started on this path)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from idist import _cli

SCRIPT_TEXT = "print('ran')\n"


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "job.py"
    path.write_text(SCRIPT_TEXT)
    return str(path)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``idist argv`` here; assert it refused with status 2 and say what it said."""
    try:
        code = _cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2, (code, err)
    assert "idist: error: " in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["-n", "99999999999999999999"], "-n must be in 1..1024 (ranks on this node), got 99999999999999999999"),
        (["-n", "0"], "-n must be in 1..1024"),
        (["-n", "two"], "argument -n/--nproc-per-node/--nprocs: invalid int value: 'two'"),
        (["--nnodes", "0"], "--nnodes must be at least 1"),
        (["-n", "1024", "--nnodes", "9999999", "--master-port", "29500"], "ranks is more than 2147483647"),
        (["--rdzv-timeout", "-5"], "--rdzv-timeout must be a number of seconds > 0, got -5.0"),
        (["--rdzv-timeout", "nan"], "--rdzv-timeout must be a number of seconds > 0, got nan"),
        (["--rdzv-timeout", "0"], "--rdzv-timeout must be a number of seconds > 0"),
        (["--liveness", "inf"], "--liveness: liveness must be a number of seconds >= 0"),
        (["--master-port", "70000"], "--master-port must be in 1..65535"),
        (["--master-addr", ""], "--master-addr is empty"),
        (["--master-addr", "192.0.2.1"], "--master-addr 192.0.2.1: '192.0.2.1' (192.0.2.1) is not an address of"),
        (["--master-addr", "no-such-host.invalid"], "--master-addr no-such-host.invalid: cannot resolve"),
        (["--nnodes", "2", "--node-rank", "1", "--master-port", "29500", "--master-addr", "no-such-host.invalid"],
         "--master-addr no-such-host.invalid: cannot resolve"),
        (["-n", "2", "--pdb-rank", "2"], "--pdb-rank 2 is outside 0..1"),
        (["--backend", "gloo_x"], "argument --backend: invalid choice: 'gloo_x'"),
        (["--backend", "horovod", "--liveness", "5", "--master-port", "29500"],
         "--backend horovod cannot honour --master-port, --liveness"),
        (["--backend", "horovod", "--rdzv-timeout", "5", "--checked"], "cannot honour --rdzv-timeout, --checked"),
        (["--backend", "horovod", "--pdb-rank", "0"], "cannot honour --pdb-rank"),
    ],
)  # fmt: skip
def test_a_flag_that_cannot_work_is_refused(
    flags: list[str], says: str, script: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused(["run", *flags, script], capsys)
    assert says in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: nccl can run")
def test_nccl_without_cuda_is_refused(script: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(["run", "--backend", "nccl", "-n", "2", script], capsys)
    assert "--backend nccl needs CUDA, which this machine does not have; use --backend gloo" in err


def test_a_missing_script_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = _refused(["run", "-n", "2", str(tmp_path / "no_such.py")], capsys)
    assert "no such script" in err


def test_horovod_without_horovodrun_says_how_to_install(
    script: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + "/usr/bin:/bin")
    if shutil.which("horovodrun"):
        pytest.skip("horovodrun is installed on this PATH")
    err = _refused(["run", "--backend", "horovod", "-n", "2", script], capsys)
    assert "--backend horovod needs horovodrun on PATH: pip install 'idist[horovod]'" in err
