"""Per-rank bodies for bench_launch.py: launch + initialize + one barrier + finalize.

Only the standard library is imported at the top, so each spawned rank imports exactly
what its implementation needs (ignite's import is part of ignite's launch cost).
"""

from __future__ import annotations


def raw(local_rank: int, world_size: int, port: int) -> None:
    """The hand-written baseline: torch.multiprocessing + init_process_group."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=local_rank, world_size=world_size)
    dist.barrier()
    dist.destroy_process_group()


def idist_mp_form(local_rank: int) -> None:
    """idist.spawn in torch.multiprocessing's form: a plain initialize() inside the function."""
    import idist

    ctx = idist.initialize()
    ctx.barrier()
    idist.finalize()


def ignite(local_rank: int) -> None:
    """pytorch-ignite's spawn initializes around the function; the body is one barrier."""
    import ignite.distributed as ign

    ign.barrier()
