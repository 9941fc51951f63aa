"""idist.Parallel: spawn mode, in-place mode, and the arguments it refuses."""

from __future__ import annotations

import pytest

import idist
import launch_fns
from idist.launch import LaunchConfigError

pytestmark = pytest.mark.timeout(300)


def test_spawn_mode_runs_fn_on_every_rank_with_args_and_kwargs() -> None:
    with idist.Parallel(backend="gloo", nproc_per_node=2) as parallel:
        assert parallel.spawns
        out = parallel.run(launch_fns.ignite_style, 1, 2, c=3)
        # the parent itself stays uninitialized in spawn mode
        assert isinstance(idist.current(), idist.SerialContext)
    assert [r["rank"] for r in out] == [0, 1]
    assert all(r["value"] == 12 and r["backend"] == "gloo" and r["world_size"] == 2 for r in out)


def test_seed_nprocs_without_backend_spawns_on_the_default_backend() -> None:
    out = idist.Parallel(nprocs=2).run(launch_fns.current_kind, scale=3)
    assert out == [("NativeContext", 0, 2, 0), ("NativeContext", 1, 2, 3)]


def test_in_place_without_launcher_is_serial_and_finalizes_on_exit() -> None:
    with idist.Parallel() as parallel:
        assert not parallel.spawns
        assert parallel.run(launch_fns.current_kind, scale=5) == [("SerialContext", 0, 1, 0)]
    assert parallel.run(launch_fns.add, 7) == [7]  # run() outside `with` initializes for the call


def test_in_place_with_a_backend_initializes_a_world_of_one() -> None:
    with idist.Parallel(backend="gloo") as parallel:
        assert parallel.run(launch_fns.current_kind) == [("NativeContext", 0, 1, 0)]
    assert isinstance(idist.current(), idist.SerialContext)


def test_a_failing_rank_raises_launch_error_from_run() -> None:
    with pytest.raises(idist.LaunchError, match=r"rank 1 \(local rank 1\) failed: ValueError: boom") as info:
        idist.Parallel(backend="gloo", nproc_per_node=2).run(launch_fns.raise_in_context, 1)
    assert info.value.rank == 1 and info.value.exitcode == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"nproc_per_node": 2, "nprocs": 3}, "disagree"),
        ({"nnodes": 2}, "pass nproc_per_node= too"),
        ({"nproc_per_node": 0}, "at least 1"),
        ({"nproc_per_node": 2, "nnodes": 2, "node_rank": 1}, "master_port"),
        ({"nproc_per_node": 2, "nnodes": 2}, "pass node_rank= too"),
        ({"nproc_per_node": 2, "join": False}, "always joins"),
        ({"nproc_per_node": 2, "bogus": 1}, "unknown Parallel options: bogus"),
    ],
)
def test_arguments_that_cannot_work(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(LaunchConfigError, match=match):
        idist.Parallel(**kwargs)  # type: ignore[arg-type]


def test_a_process_count_under_a_launcher_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(LaunchConfigError, match="started by torchrun"):
        idist.Parallel(backend="gloo", nproc_per_node=2)
    assert idist.launch.launched_by() == "torchrun"
