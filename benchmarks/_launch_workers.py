"""The per-rank bodies of the launch benchmark, one per implementation.

Kept in their own module, importing only the standard library at the top, so that a
spawned child imports exactly what its implementation needs (ignite's import is part of
ignite's launch cost, not of the others').
"""

from __future__ import annotations


def raw_worker(rank: int, world_size: int, port: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    dist.barrier()
    dist.destroy_process_group()


def ignite_worker(local_rank: int) -> None:
    import ignite.distributed as ign

    ign.barrier()


def idist_worker(local_rank: int) -> None:
    import idist

    idist.initialize()
    idist.barrier()
    idist.finalize()


def idist_by_hand_worker(rank: int, world_size: int, port: int) -> None:
    import idist

    idist.initialize("gloo", rank=rank, world_size=world_size, master_addr="127.0.0.1", master_port=port)
    idist.barrier()
    idist.finalize()
