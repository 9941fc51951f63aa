"""ignite.distributed 0.5.5 code runs on idist: the argument forms and names of issue 13.

One test per form: keyword names (item 1), ignite's missing names (item 2), show_config
and Parallel visible without logging set up (item 3), Parallel's ignite arguments (item 4),
an init_method that needs no MASTER_* (item 5). Written for idist; ignite's own suite is
not copied here. The deliberate differences are in docs/migrating-from-ignite.md.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler, SequentialSampler, WeightedRandomSampler

import idist
from idist.testing import simulate
from launch_util import run_py
from multiproc import free_port, run_ranks

pytestmark = pytest.mark.timeout(300)

NO_MASTER = ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


# ------------------------------------------------------------ item 1: keyword names
def _keyword_collectives(ctx: idist.NativeContext) -> dict[str, Any]:
    r = ctx.rank
    t = torch.tensor([1.0, r])
    same = idist.all_reduce(tensor=t, op="SUM")
    return {
        "all_reduce": (same is t, t.tolist()),
        "all_reduce_float": idist.all_reduce(tensor=0.5 * (r + 1), op="MAX"),
        "all_gather": [x.tolist() for x in idist.all_gather(tensor=torch.tensor([r]))],
        "broadcast": idist.broadcast(tensor=torch.tensor([r + 10]), src=1).tolist(),
        "ctx_all_reduce": ctx.all_reduce(tensor=r + 1),
        "ctx_all_gather": ctx.all_gather(tensor=f"r{r}"),
        "ctx_broadcast": ctx.broadcast(tensor=r + 20, src=0),
    }


def test_collectives_take_the_tensor_keyword() -> None:
    for out in simulate(2, _keyword_collectives):
        assert out["all_reduce"] == (True, [2.0, 1.0])
        assert out["all_reduce_float"] == 1.0
        assert out["all_gather"] == [[0], [1]]
        assert out["broadcast"] == [11]
        assert out["ctx_all_reduce"] == 3
        assert out["ctx_all_gather"] == ["r0", "r1"]
        assert out["ctx_broadcast"] == 20


def test_auto_dataloader_takes_dataset_and_dataloader_keywords() -> None:
    data = list(range(8))
    by_dataset = idist.auto_dataloader(dataset=data, batch_size=4)
    by_loader = idist.auto_dataloader(dataloader=DataLoader(data, batch_size=4))
    assert [b.tolist() for b in by_dataset] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [b.tolist() for b in by_loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [b.tolist() for b in idist.current().auto_dataloader(dataset=data, batch_size=8)] == [data]
    with pytest.raises(TypeError):
        idist.auto_dataloader(data, dataset=data)  # type: ignore[call-overload]


# ------------------------------------------------------------ item 2: ignite's names
def _local_rank_hint(rank: int, port: int) -> tuple[int, int, int]:
    import torch.distributed as dist

    for k in (*NO_MASTER, "RANK", "WORLD_SIZE"):
        os.environ.pop(k, None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        before = idist.get_local_rank()  # adopted without a hint
        idist.set_local_rank(1 - rank)
        after = idist.get_local_rank()
        return before, after, idist.all_reduce(rank + 1)
    finally:
        dist.destroy_process_group()


def test_set_local_rank_hints_a_group_the_user_created() -> None:
    port = free_port()
    results = run_ranks(_local_rank_hint, 2, port, set_launcher_env=False, timeout=120)
    # the hint replaces the guess (local rank = rank) and the group keeps working
    assert results == [(0, 1, 3), (1, 0, 3)]


def _shapes(ctx: idist.NativeContext) -> dict[str, Any]:
    r = ctx.rank
    mine = torch.arange((r + 1) * (r + 2), dtype=torch.float32).reshape(r + 1, r + 2) + 100 * r
    shapes = [[q + 1, q + 2] for q in range(ctx.world_size)]
    everyone = idist.all_gather_tensors_with_shapes(mine, shapes)
    members = idist.all_gather_tensors_with_shapes(mine, [[2, 3], [3, 4]], group=[1, 2])
    return {"all": [t.tolist() for t in everyone], "group": [t.tolist() for t in members], "mine": mine.tolist()}


def test_all_gather_tensors_with_shapes_returns_each_ranks_tensor() -> None:
    out = simulate(3, _shapes)
    mine = [o["mine"] for o in out]
    for r, o in enumerate(out):
        assert o["all"] == mine
        assert o["group"] == ([mine[0]] if r == 0 else mine[1:])


def _declared_shape_wrong(ctx: idist.NativeContext) -> str:
    try:
        idist.all_gather_tensors_with_shapes(torch.zeros(2, 2), [[2, 2], [3, 2]])
    except ValueError as e:
        return type(e).__name__
    return "no error"


def test_all_gather_tensors_with_shapes_refuses_a_tensor_of_another_shape() -> None:
    # rank 1 declares 3 x 2 but sends 2 x 2: every rank raises, none gets padding back
    assert simulate(2, _declared_shape_wrong) == ["CollectiveInputError", "CollectiveInputError"]


def test_distributed_proxy_sampler_shards_the_samplers_draw() -> None:
    weights = torch.ones(40)
    weights[:20] += 1
    sampler = WeightedRandomSampler(weights, 60)
    proxies = [idist.DistributedProxySampler(sampler, num_replicas=4, rank=r) for r in range(4)]
    assert all(isinstance(p, DistributedSampler) for p in proxies)
    for epoch in (0, 3):
        torch.manual_seed(epoch)
        drawn = list(sampler)
        shards = []
        for p in proxies:
            p.set_epoch(epoch)
            shards.append(list(p))
        assert sorted(i for s in shards for i in s) == sorted(drawn)
        assert shards[1] == drawn[1::4]


def _proxy_defaults(ctx: idist.NativeContext) -> list[tuple[int, int, list[int]]]:
    sampler = SequentialSampler(range(10))
    both = idist.DistributedProxySampler(sampler)  # ignite: num_replicas=None, rank=None
    rank_only = idist.DistributedProxySampler(sampler, num_replicas=5)
    replicas_only = idist.DistributedProxySampler(sampler, rank=0)
    return [(p.num_replicas, p.rank, list(p)) for p in (both, rank_only, replicas_only)]


def test_distributed_proxy_sampler_takes_what_is_left_out_from_the_current_context() -> None:
    for rank, got in enumerate(simulate(3, _proxy_defaults)):
        assert got == [(3, rank, list(range(rank, 10, 3))), (5, rank, list(range(rank, 10, 5))), (3, 0, [0, 3, 6, 9])]
    # no distributed context: the serial one, a single replica that takes everything
    serial = idist.DistributedProxySampler(SequentialSampler(range(4)))
    assert (serial.num_replicas, serial.rank, list(serial)) == (1, 0, [0, 1, 2, 3])


@pytest.mark.parametrize("bad", [None, Sampler(), DistributedSampler(list(range(4)), num_replicas=2, rank=0)])
def test_distributed_proxy_sampler_refuses_what_it_cannot_wrap(bad: object) -> None:
    with pytest.raises(TypeError):
        idist.DistributedProxySampler(bad, num_replicas=2, rank=0)  # type: ignore[arg-type]


def _loader_sampler(ctx: idist.NativeContext) -> tuple[bool, int]:
    custom = WeightedRandomSampler(torch.ones(10), 10)
    loader = idist.auto_dataloader(list(range(10)), sampler=custom, batch_size=2)
    return isinstance(loader.sampler, idist.DistributedProxySampler), len(list(loader.sampler))


def test_auto_dataloader_wraps_a_custom_sampler_in_distributed_proxy_sampler() -> None:
    assert simulate(2, _loader_sampler) == [(True, 5), (True, 5)]


def _group_answers_rank(ctx: idist.NativeContext) -> dict[str, Any]:
    r = ctx.rank
    g = idist.new_group([1, 2])
    t = torch.tensor([r + 1])
    idist.barrier(group=g)
    return {
        "rank": g.rank(),
        "all_reduce": idist.all_reduce(t, group=g).tolist(),
        "all_gather": [x.tolist() for x in idist.all_gather(torch.tensor([r]), group=g)],
    }


def test_new_group_answers_rank_and_works_as_group() -> None:
    out = simulate(3, _group_answers_rank)
    assert [o["rank"] for o in out] == [-1, 0, 1]  # -1: not a member (torch's dist.get_rank(group))
    assert [o["all_reduce"] for o in out] == [[1], [5], [5]]
    assert [o["all_gather"] for o in out] == [[[0]], [[1], [2]], [[1], [2]]]


def _torch_group(rank: int) -> tuple[list[int], list[list[int]]]:
    import torch.distributed as dist

    idist.initialize("gloo", timeout=60)
    try:
        g = dist.new_group([1])  # rank 0 gets torch's NON_GROUP_MEMBER, as ignite's new_group gives
        reduced = idist.all_reduce(torch.tensor([rank + 1]), group=g).tolist()
        gathered = [x.tolist() for x in idist.all_gather(torch.tensor([rank]), group=g)]
        return reduced, gathered
    finally:
        idist.finalize()


def test_a_torch_group_works_on_members_and_non_members() -> None:
    assert run_ranks(_torch_group, 2, timeout=120) == [([1], [[0]]), ([2], [[1]])]


# ---------------------------------------------- item 3: visible without logging set up
def test_show_config_prints_when_logging_is_not_configured() -> None:
    proc = run_py(["-c", "import idist; idist.show_config()"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "serial" in proc.stderr
    assert re.search(r"world[ _]size\W+1\b", proc.stderr), proc.stderr
    assert re.search(r"\brank\W+0\b", proc.stderr), proc.stderr


def test_show_config_uses_the_users_logging_once_it_is_configured() -> None:
    code = (
        "import logging, sys, idist\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='USER %(name)s %(message)s')\n"
        "idist.show_config()\n"
    )
    proc = run_py(["-c", code], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "USER idist" in proc.stdout and re.search(r"world[ _]size\W+1\b", proc.stdout)
    assert not re.search(r"world[ _]size", proc.stderr), proc.stderr  # not printed twice


PARALLEL_SCRIPT = """
import idist

def fn(local_rank):
    return idist.get_rank()

if __name__ == "__main__":
    with idist.Parallel(backend="gloo", nproc_per_node=2) as parallel:
        print("results", parallel.run(fn))
"""


def test_parallel_reports_its_run_without_logging_set_up(tmp_path: Path) -> None:
    script = tmp_path / "parallel_run.py"
    script.write_text(PARALLEL_SCRIPT)
    proc = run_py([str(script)], timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "results [0, 1]" in proc.stdout
    # ignite's launcher lines, which scripts and ignite's tests look for
    assert "in 2 processes" in proc.stderr and "End of run" in proc.stderr, proc.stderr


# ----------------------------------------------------- item 4: Parallel's ignite forms
def _rank_and_port(local_rank: int) -> tuple[int, str | None]:
    return idist.get_rank(), os.environ.get("MASTER_PORT")


def test_parallel_takes_none_for_every_default_and_a_string_port() -> None:
    port = free_port()
    parallel = idist.Parallel(
        backend="gloo", nproc_per_node=2, nnodes=None, node_rank=None,
        master_addr=None, master_port=str(port),  # type: ignore[arg-type]  # argparse gives strings
    )  # fmt: skip
    assert parallel.run(_rank_and_port) == [(0, str(port)), (1, str(port))]


def test_parallel_with_no_process_count_and_all_none_runs_in_place() -> None:
    with idist.Parallel(
        backend=None, nproc_per_node=None, nnodes=None, node_rank=None, master_addr=None, master_port=None
    ) as parallel:
        assert parallel.run(_rank_and_port)[0][0] == 0
        assert isinstance(idist.current(), idist.SerialContext)


def test_parallel_under_torchrun_accepts_explicit_nones(monkeypatch: pytest.MonkeyPatch) -> None:
    port = str(free_port())
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with idist.Parallel(
        backend="gloo", nproc_per_node=None, nnodes=None, node_rank=None, master_addr=None, master_port=None
    ) as parallel:
        assert parallel.run(_rank_and_port) == [(0, port)]
        assert idist.backend() == "gloo"


@pytest.mark.parametrize("port", ["http", "0", "70000", "33.4"])
def test_parallel_refuses_a_port_that_is_not_a_port(port: str) -> None:
    with pytest.raises(idist.LaunchConfigError, match="master_port"):
        idist.Parallel(backend="gloo", nproc_per_node=2, master_port=port)  # type: ignore[arg-type]


def test_parallel_refuses_an_unknown_backend_at_construction() -> None:
    with pytest.raises(idist.UnknownBackendError):
        idist.Parallel(backend="abc")
    with pytest.raises(idist.UnknownBackendError):
        idist.Parallel(backend="abc", nproc_per_node=2)


def test_parallel_refuses_tcp_init_method_for_spawned_ranks() -> None:
    with pytest.raises(idist.LaunchConfigError, match="tcp://"):
        idist.Parallel(backend="gloo", init_method="tcp://10.1.1.20:23456", nproc_per_node=1)


def test_parallel_error_names_only_the_arguments_passed() -> None:
    with pytest.raises(idist.LaunchConfigError) as info:
        idist.Parallel(nnodes=2, node_rank=None, master_addr=None, master_port=None)
    message = str(info.value)
    assert "nnodes" in message
    assert not any(name in message for name in ("node_rank", "master_addr", "master_port")), message


# ------------------------------------------------ item 5: init_method without MASTER_*
def _init_without_master(rank: int, init_method: str) -> tuple[int, int]:
    for k in NO_MASTER:
        os.environ.pop(k, None)
    os.environ.update(RANK=str(rank), WORLD_SIZE="2")
    ctx = idist.initialize("gloo", init_method=init_method, timeout=60)
    try:
        return ctx.world_size, ctx.all_reduce(rank + 1)
    finally:
        idist.finalize()


@pytest.mark.parametrize("kind", ["file", "tcp"])
def test_init_method_with_rank_and_world_size_needs_no_master(kind: str, tmp_path: Path) -> None:
    url = f"file://{tmp_path}/rendezvous" if kind == "file" else f"tcp://127.0.0.1:{free_port()}"
    assert run_ranks(_init_without_master, 2, url, set_launcher_env=False, timeout=120) == [(2, 3), (2, 3)]


def _parallel_in_place_with_file(rank: int, url: str) -> list[tuple[int, int]]:
    for k in NO_MASTER:
        os.environ.pop(k, None)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    with idist.Parallel(backend="gloo", init_method=url) as parallel:
        return parallel.run(_local_and_world)


def _local_and_world(local_rank: int) -> tuple[int, int]:
    return local_rank, idist.all_reduce(1)


def test_parallel_in_place_with_file_init_method_and_no_master(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/rendezvous"
    results = run_ranks(_parallel_in_place_with_file, 2, url, set_launcher_env=False, timeout=120)
    assert results == [[(0, 2)], [(1, 2)]]


def _env_without_master(rank: int) -> str:
    for k in NO_MASTER:
        os.environ.pop(k, None)
    os.environ.update(RANK=str(rank), WORLD_SIZE="2")
    try:
        idist.initialize("gloo", init_method="env://")
    except idist.LaunchEnvironmentError as e:
        return str(e)
    idist.finalize()
    return "initialized"


def test_env_init_method_still_needs_master_addr_and_port() -> None:
    # env:// has no default port in idist (ignite falls back to 15000): still refused
    for message in run_ranks(_env_without_master, 2, set_launcher_env=False, timeout=120):
        assert "MASTER_ADDR" in message and "MASTER_PORT" in message
