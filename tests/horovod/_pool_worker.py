"""One rank of a ``HorovodWorld``: ``python _pool_worker.py HOST PORT`` under horovodrun.

Joins Horovod through the public ``idist.initialize()`` (horovodrun's environment selects
the backend), connects back to the parent (authkey from ``IDIST_POOL_AUTHKEY``), then runs
pickled ``(fn, args)`` jobs as ``fn(ctx, *args)`` until it gets an empty job.
"""

from __future__ import annotations

import multiprocessing.connection as mpc
import os
import pickle
import sys

from idist.testing._jobs import pack, serve_and_exit


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    authkey = bytes.fromhex(os.environ.pop("IDIST_POOL_AUTHKEY"))
    conn = mpc.Client((host, port), authkey=authkey)
    rank = int(os.environ["HOROVOD_RANK"])
    import idist

    try:
        ctx = idist.initialize()
        if ctx.backend != "horovod" or ctx.rank != rank:
            raise RuntimeError(f"expected the horovod backend at rank {rank}, got {ctx!r}")
    except BaseException as exc:
        conn.send_bytes(pickle.dumps((rank, pack(False, exc))))
        return
    conn.send_bytes(pickle.dumps((rank, pack(True, "ready"))))
    serve_and_exit(ctx, f"horovod rank {rank}", conn.recv_bytes, conn.send_bytes)


if __name__ == "__main__":
    main()
