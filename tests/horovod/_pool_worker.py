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
import traceback

from hvd_transport import dumps


def _pack(ok: bool, value: object) -> bytes:
    try:
        return dumps((ok, value))
    except Exception as exc:
        text = "".join(traceback.format_exception(value if isinstance(value, BaseException) else exc))
        return pickle.dumps((False, RuntimeError(text)), protocol=pickle.HIGHEST_PROTOCOL)


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
        conn.send_bytes(pickle.dumps((rank, _pack(False, exc))))
        return
    conn.send_bytes(pickle.dumps((rank, _pack(True, "ready"))))
    try:
        while True:
            job = conn.recv_bytes()
            if not job:
                break
            try:
                fn, args = pickle.loads(job)
                reply = _pack(True, fn(ctx, *args))
            except BaseException as exc:
                note = "".join(traceback.format_exception(exc))
                exc.add_note(f"--- traceback on horovod rank {rank} ---\n{note}")
                reply = _pack(False, exc)
            conn.send_bytes(reply)
    except (EOFError, OSError):
        pass
    finally:
        idist.finalize()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
