"""``idist run``'s elastic flags: a value that cannot work ends the command with ``idist: error:`` and
status 2, naming the flag, before any agent or rank starts (in process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from idist import LaunchConfigError
from idist.launch import _elastic
from test_launch_args import _refused


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "job.py"
    path.write_text("print('ran')\n")
    return str(path)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--nnodes", "3:2"], "--nnodes 3:2: MIN (3) is more than MAX (2); pass MIN:MAX with MIN <= MAX"),
        (["--nnodes", "0:2"], "--nnodes 0:2: MIN must be at least 1"),
        (["--nnodes", "1:x"], "--nnodes takes N or MIN:MAX (whole numbers), got '1:x'"),
        (["--nnodes", "1:2:3"], "--nnodes takes N or MIN:MAX, got '1:2:3'"),
        (["--max-restarts", "-1"], "--max-restarts must be 0 or more (restarts after a failure), got -1"),
        (["--nnodes", "1:2"], "--nnodes 1:2: pass the same rendezvous endpoint to every node"),
        (["--nnodes", "1:2", "--rdzv-endpoint", "h"], "--rdzv-endpoint takes HOST:PORT"),
        (["--rdzv-endpoint", "127.0.0.1:29500", "--master-port", "29500"], "pass --rdzv-endpoint or --master-addr"),
        (["--backend", "horovod", "--max-restarts", "1"], "--backend horovod cannot run an elastic job"),
        (["--max-restarts", "1", "--pdb-rank", "0"], "--pdb-rank debugs one rank of a fixed job"),
        (["--nnodes", "1:2", "--node-rank", "1", "--master-port", "29500"], "drop --node-rank"),
        (["-n", "1024", "--nnodes", "1:9999999", "--master-port", "29500"], "is more than 2147483647 ranks"),
    ],
)
def test_elastic_flags_that_cannot_work_are_refused_at_once(
    flags: list[str], says: str, script: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused(["run", *flags, script], capsys)
    assert "idist: error: " in err and says in err, err


def test_the_checks_raise_a_typed_error_for_callers_of_the_launch_api() -> None:
    with pytest.raises(LaunchConfigError, match=r"MIN \(3\) is more than MAX \(2\)"):
        _elastic.node_range("3:2")
    with pytest.raises(LaunchConfigError, match="--max-restarts must be 0 or more"):
        _elastic.plan((1, 1), 1, -1, None, None, None)
    assert _elastic.node_range("2") == (2, 2) and _elastic.node_range("1:4") == (1, 4)
