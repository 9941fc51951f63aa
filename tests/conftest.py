from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# the multi-process harness lives beside the tests
sys.path.insert(0, str(Path(__file__).parent))

# The `slow` marker, kept here rather than on each test so that test files need no edits.
# A test is slow when it starts processes: ranks (spawn, Parallel, torchrun, idist run,
# ProcessWorld), real launchers, examples, or a fresh interpreter (~3 s each for torch's
# import alone). In-process tests (serial, simulated thread ranks, environment parsing)
# stay in the quick tier, `bash scripts/test.sh --quick` (-m "not slow"). Measured with
# `pytest --durations=0`: the modules below take 2-115 s each, the rest 0-6 s in all.
# A new module or test that starts processes, or waits out seconds, belongs in one of these lists.
SLOW_MODULES = {
    "test_bad_input_gloo.py",
    "test_checkpoint_gloo.py",
    "test_collectives_gloo.py",
    "test_docs_types.py",
    "test_elastic_rendezvous.py",
    "test_exit_broken.py",
    "test_failures.py",
    "test_ignite_compat.py",
    "test_launch_cli.py",
    "test_launch_elastic.py",
    "test_launch_examples.py",
    "test_launch_parallel.py",
    "test_launch_spawn.py",
    "test_launch_unix.py",
    "test_package_types.py",
    "test_launchers_real.py",
    "test_native_groups.py",
    "test_scale_job.py",
    "test_torchrun.py",
    "test_training_examples.py",
    "test_training_gloo.py",
    "test_typing_user.py",
    "test_testing_exit.py",
}
# In modules that are mostly in-process: the tests that start processes (a prefix of
# "module.py::test_name", so every parametrization is covered).
SLOW_TESTS = (
    "test_launch_elastic_fn.py::test_parallel_with_max_restarts",
    "test_launch_elastic_fn.py::test_spawn_with_a_node_range",
    "test_launch_elastic_fn.py::test_a_restart_budget",
    "test_launch_elastic_fn.py::test_a_lost_node",
    "test_exit.py::test_a_script_that_never_finalizes_exits_cleanly",
    "test_exit.py::test_gloo_workers_let_go_of_python_objects_before_the_interpreter_finalizes",
    "test_optional_backends.py::test_importing_idist_and_the_backend_never_imports_the_package",
    "test_launch_driven.py::test_spawned_native_ranks_drop_an_enclosing_xla_launchers_variables",
    "test_launch_driven.py::test_initialize_in_a_fresh_interpreter_stays_serial_without_a_launcher",
    "test_testing_pool.py::test_runs_on_real_processes_in_rank_order",
    "test_testing_pool.py::test_any_dtype_travels_back",
    "test_testing_pool.py::test_a_failing_rank_is_named_and_the_pool_survives",
    "test_testing_pool.py::test_an_exception_that_cannot_be_unpickled_keeps_its_message",
    "test_testing_pool.py::test_a_rank_stuck_after_a_failure_restarts_the_pool",
    "test_testing_pool.py::test_a_timeout_names_the_rank_and_stops_the_processes",
    "test_testing_pool.py::test_the_plugin_gives_users_a_simulated_world",
    "test_faults.py::test_checked_mode_names_an_absent_rank_without_a_section_timeout",
    "test_faults.py::test_one_bad_process_breaks_the_default_group_of_every_process",
    "test_faults.py::test_one_node_launches_listen_on_loopback_only",
    "test_faults.py::test_idist_run_prefixes_each_line_once",
    "test_fsdp_gloo.py::test_two_fsdp_ranks",
    "test_fsdp_gloo.py::test_each_fsdp_rank",
    "test_fsdp_gloo.py::test_accumulation_under_no_sync",
    "test_fsdp_gloo.py::test_bad_fsdp_options",
    "test_liveness.py::test_a_slow_rank_that_is_alive_is_never_declared_lost",
    "test_liveness.py::test_a_frozen_peer_is_lost_within_the_limit_not_the_collective_timeout",
    "test_liveness.py::test_liveness_zero_turns_it_off",
    "test_liveness.py::test_a_rank_blocked_in_torchs_own_collective_ends_when_a_peer_is_lost",
    "test_suite_harness.py::test_ranks_see_the_callers_environment_and_folder_at_the_call",
    # no processes, but real stores and liveness limits waited out (3-20 s each)
    "test_scale.py::test_steady_state_costs",
    "test_scale.py::test_a_lost_node_a_lost_rank",
    "test_scale.py::test_a_store_that_stops_answering",
    "test_scale.py::test_join_costs",
    "test_scale.py::test_a_failure_diagnosis_costs",
    "test_scale.py::test_agreeing_on_a_failure_costs",
)

# The `timed` marker: tests that assert a bound in seconds (a failure within a limit, a limit
# really waited out). On xdist they form one group (the root conftest.py): one worker runs them
# one after another, so they never load each other and at most one other test runs beside
# them. Whole modules, and prefixes of "module.py::test_name" as for SLOW_TESTS.
TIMED_MODULES = {
    "test_failures.py",
    "test_liveness.py",
    "test_rendezvous.py",
    "netns/test_netns_faults.py",
    "netns/test_netns_liveness.py",
}
TIMED_TESTS = (
    "test_testing_pool.py::test_a_rank_stuck_after_a_failure_restarts_the_pool",
    "test_testing_simulate.py::test_a_failing_run_ends_within_half_a_second",
    "test_faults.py::test_one_rank_alone_with_bad_input_breaks_the_group_on_every_rank_within_a_second",
    "test_faults.py::test_checked_mode_names_an_absent_rank_without_a_section_timeout",
    "test_faults.py::test_one_bad_process_breaks_the_default_group_of_every_process",
    "test_launch_unix.py::test_a_launcher_stopped_by_a_signal_leaves_nothing_running",
    "test_launch_spawn.py::test_a_parent_killed_with_sigkill_leaves_no_orphans",
    "test_testing_exit.py::test_runs_end_whatever_the_ranks_do_ctrl_c_stops_them_and_exit_is_prompt",
    "test_launch_driven.py::test_a_missing_package_raises_the_install_hint_before_anything_starts",
    "test_launch_spawn.py::test_a_failing_rank_fails_the_launch_fast_and_the_others_are_stopped",
    "test_launch_spawn.py::test_ctrl_c_in_the_parent_stops_every_rank",
)


# tryfirst, and before the root conftest.py's hook, which groups the timed tests (see there)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        path = Path(item.path)
        if not path.is_relative_to(here):
            continue
        rel = path.relative_to(here).as_posix()
        node = rel + "::" + item.nodeid.split("::", 1)[-1]
        if rel in SLOW_MODULES or node.startswith(SLOW_TESTS) or rel.startswith(("horovod/", "xla/", "netns/")):
            item.add_marker(pytest.mark.slow)
        if rel in TIMED_MODULES or node.startswith(TIMED_TESTS):
            item.add_marker(pytest.mark.timed)


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Launches in this test make their temporary folders here; none may be left behind."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    assert list(folder.iterdir()) == []
