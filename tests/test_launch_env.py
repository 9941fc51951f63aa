"""Launcher environment detection with the variables each launcher really sets."""

from __future__ import annotations

import pytest
import torch

from idist import LaunchEnvironmentError
from idist._detect import detect_backend
from idist._launch_env import detect, expand_hostlist


def test_no_launcher_is_none() -> None:
    assert detect({"HOME": "/root"}) is None


def test_torchrun_variables() -> None:
    env = {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "x",
    }  # fmt: skip
    info = detect(env)
    assert info is not None
    assert (info.launcher, info.topology.rank, info.topology.world_size, info.topology.local_rank) == (
        "torchrun",
        3,
        4,
        1,
    )
    assert (info.topology.nproc_per_node, info.topology.node_rank, info.topology.nnodes) == (2, 1, 2)
    assert (info.master_addr, info.master_port) == ("10.0.0.1", 29400)
    assert info.decided_by["rank"] == "RANK=3"


def test_partial_torchrun_names_the_missing_variables() -> None:
    with pytest.raises(LaunchEnvironmentError, match="MASTER_ADDR, MASTER_PORT missing"):
        detect({"RANK": "0", "WORLD_SIZE": "2"})


def test_rank_outside_world_is_an_error() -> None:
    env = {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    with pytest.raises(LaunchEnvironmentError, match=r"rank 2 is outside 0\.\.1"):
        detect(env)


def test_non_integer_names_the_variable() -> None:
    with pytest.raises(LaunchEnvironmentError, match="WORLD_SIZE='two'"):
        detect({"RANK": "0", "WORLD_SIZE": "two", "MASTER_ADDR": "h", "MASTER_PORT": "1"})


SRUN_ENV = {  # what `srun -N 2 -n 4` sets on the second task of node 1
    "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
    "SLURM_NODEID": "1", "SLURM_JOB_ID": "12345", "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "gpu[07-08]",
}  # fmt: skip


def test_slurm_variables_and_port_from_job_id() -> None:
    info = detect(SRUN_ENV)
    assert info is not None
    assert (info.launcher, info.topology.rank, info.topology.world_size, info.topology.local_rank) == ("slurm", 3, 4, 1)
    assert (info.topology.nproc_per_node, info.topology.node_rank, info.topology.nnodes) == (2, 1, 2)
    assert info.master_addr == "gpu07"
    assert info.master_port == 15000 + 12345 % 20000
    assert "SLURM_JOB_NODELIST" in info.decided_by["master"]


def test_slurm_with_only_master_port_set_by_the_user() -> None:
    info = detect(dict(SRUN_ENV, MASTER_PORT="29555", MASTER_ADDR="gpu07"))
    assert info is not None and info.launcher == "slurm"
    assert (info.master_addr, info.master_port) == ("gpu07", 29555)


def test_partial_slurm() -> None:
    env = {k: v for k, v in SRUN_ENV.items() if k != "SLURM_JOB_NODELIST"}
    with pytest.raises(LaunchEnvironmentError, match="SLURM_JOB_NODELIST missing"):
        detect(env)


def test_torchrun_inside_slurm_uses_torchrun() -> None:
    env = dict(SRUN_ENV, RANK="1", WORLD_SIZE="8", LOCAL_RANK="1", MASTER_ADDR="gpu07", MASTER_PORT="29500")
    info = detect(env)
    assert info is not None and info.launcher == "torchrun" and info.topology.world_size == 8


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("gpu[007-009,12],cpu-a", ["gpu007", "gpu008", "gpu009", "gpu12", "cpu-a"]),
        ("a[1,3]-ib,b2", ["a1-ib", "a3-ib", "b2"]),
    ],
)
def test_hostlist_expansion(nodelist: str, hosts: list[str]) -> None:
    assert expand_hostlist(nodelist) == hosts


OMPI_ENV = {  # what `mpirun -np 2` (OpenMPI 4) sets for rank 1
    "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "0", "PMIX_NAMESPACE": "prterun-host-1234@1",
}  # fmt: skip


def test_openmpi_single_node_gets_loopback_and_a_job_port() -> None:
    info = detect(OMPI_ENV)
    assert info is not None
    assert (info.launcher, info.topology.rank, info.topology.world_size, info.topology.local_rank) == (
        "openmpi",
        1,
        2,
        1,
    )
    assert info.master_addr == "127.0.0.1"
    assert info.master_port is not None and 20000 <= info.master_port < 40000
    other_job = detect(dict(OMPI_ENV, PMIX_NAMESPACE="prterun-host-999@1"))
    assert other_job is not None and other_job.master_port != info.master_port


def test_openmpi_multi_node_needs_master() -> None:
    env = dict(OMPI_ENV, OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_RANK="3")
    info = detect(env)
    assert info is not None and info.master_port is None and info.topology.nnodes == 2
    assert "set MASTER_ADDR and MASTER_PORT" in info.decided_by["master"]


def test_mpich_pmi_variables() -> None:
    env = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2", "PMI_KVSNAME": "kvs_1"}
    info = detect(env)
    assert info is not None and (info.launcher, info.topology.rank, info.topology.world_size) == ("mpich", 0, 2)


def test_partial_pmi() -> None:
    with pytest.raises(LaunchEnvironmentError, match="PMI_SIZE missing"):
        detect({"PMI_RANK": "0"})


def test_contradictory_launchers_name_both() -> None:
    env = dict(OMPI_ENV, RANK="0", WORLD_SIZE="2", MASTER_ADDR="h", MASTER_PORT="1")
    with pytest.raises(LaunchEnvironmentError, match=r"torchrun says rank 0 of 2 .* openmpi says rank 1 of 2"):
        detect(env)


def test_idist_run_backend_flag_decides_the_ranks_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("IDIST_BACKEND", "nccl")  # what `idist run --backend nccl` sets
    assert detect_backend() == "nccl"
    monkeypatch.setenv("IDIST_BACKEND", "gloo")
    assert detect_backend() == "gloo"
    monkeypatch.delenv("IDIST_BACKEND")
    assert detect_backend() == ("nccl" if torch.cuda.is_available() else "gloo")
