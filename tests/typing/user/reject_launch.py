"""#35 item 7: spawn and Parallel check ``fn``'s arguments, and their backend names."""

from __future__ import annotations

import idist


def work(local_rank: int, scale: float) -> float:
    return float(local_rank) + scale


def spawn_wrong_args() -> None:
    # rejected: mypy[arg-type] pyright[reportArgumentType]
    idist.spawn(work, args=("2",), nprocs=2)


def spawn_missing_arg() -> None:
    # rejected: mypy[call-overload] pyright[reportCallIssue,reportArgumentType]
    idist.spawn("gloo", work, (), nproc_per_node=2)


def spawn_mpi() -> None:
    # rejected: mypy[call-overload] pyright[reportCallIssue,reportArgumentType]
    idist.spawn("mpi", work, (1.0,), nproc_per_node=2)


def parallel_missing_arg() -> None:
    with idist.Parallel() as p:
        # rejected: mypy[call-arg] pyright[reportCallIssue]
        p.run(work)


def parallel_wrong_arg() -> None:
    # rejected: mypy[arg-type] pyright[reportArgumentType]
    idist.Parallel().run(work, "2")


def parallel_typo() -> None:
    # rejected: mypy[call-overload] pyright[reportCallIssue,reportArgumentType]
    idist.Parallel(backend="glo")


def parallel_never_spawns_serial() -> None:
    # rejected: mypy[call-overload] pyright[reportCallIssue,reportArgumentType]
    with idist.Parallel(backend="serial", nproc_per_node=2) as p:
        p.run(work, 1.0)


def parallel_joins() -> None:
    # rejected: mypy[call-overload] pyright[reportCallIssue,reportArgumentType]
    idist.Parallel("gloo", 2, join=False)


def spawn_elastic_handle() -> None:
    # an elastic launch joins: the agent restarts the ranks until the job ends
    # rejected: mypy[call-overload] pyright[reportCallIssue,reportArgumentType]
    idist.spawn(work, (1.0,), 2, join=False, max_restarts=1)


def spawn_elastic_horovod() -> None:
    # rejected: mypy[call-overload] pyright[reportArgumentType]
    idist.spawn("horovod", work, (1.0,), nproc_per_node=2, max_restarts=1)
