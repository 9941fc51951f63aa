"""Process Management with Spawn: start 2 gloo ranks from Python, collect their results,
and see a failing rank reported by number with its traceback while the others are stopped.

Run: python examples/spawn_processes.py
"""

from __future__ import annotations

import idist


def worker(local_rank: int, greeting: str) -> int:
    # idist.spawn set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT...: initialize() finds them.
    ctx = idist.initialize("gloo")
    try:
        print(f"[rank {ctx.rank}/{ctx.world_size}] {greeting} from local rank {local_rank}", flush=True)
        ctx.barrier()
        return ctx.rank * 10
    finally:
        idist.finalize()


def flaky(local_rank: int) -> None:
    ctx = idist.initialize("gloo")
    if ctx.rank == 1:
        raise RuntimeError("rank 1 ran out of luck")
    ctx.barrier()  # rank 0 would wait here forever; spawn stops it instead


def world_size_inside(local_rank: int) -> int:
    return idist.get_world_size()


def main() -> None:
    results = idist.spawn(worker, args=("hello",), nprocs=2)
    print(f"results in rank order: {results}", flush=True)

    # ignite's signature works too: the context is initialized around the function.
    sizes = idist.spawn("gloo", world_size_inside, (), nproc_per_node=2)
    print(f"world sizes seen inside ignite-style spawn: {sizes}", flush=True)

    try:
        idist.spawn(flaky, nprocs=2)
    except idist.LaunchError as e:
        print(f"caught LaunchError: rank {e.rank} failed with exit code {e.exitcode}", flush=True)
        print(str(e).splitlines()[0], flush=True)


if __name__ == "__main__":
    main()
