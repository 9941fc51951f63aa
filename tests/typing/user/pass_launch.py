"""#35 item 7, accepted: arguments that fit ``fn``, and the backends each form starts."""

from __future__ import annotations

from typing import reveal_type

import idist


def work(local_rank: int, scale: float, *, offset: float = 0.0) -> float:
    return local_rank * scale + offset


def launches() -> None:
    reveal_type(idist.spawn(work, args=(2.0,), nprocs=2))  # revealed: list[float]
    reveal_type(idist.spawn(work, (2.0,), 2, join=False))  # revealed: SpawnHandle[float]
    reveal_type(idist.spawn("gloo", work, (2.0,), nproc_per_node=2))  # revealed: list[float]
    reveal_type(idist.spawn("gloo", work, (2.0,), kwargs_dict={"offset": 1.0}))  # revealed: list[float]
    with idist.Parallel(backend="gloo", nproc_per_node=2) as p:
        reveal_type(p.run(work, 2.0, offset=1.0))  # revealed: list[float]
    idist.Parallel(backend="mpi")  # in place, under mpirun
    idist.Parallel("serial").run(work, 1.0)
