"""Rank functions of bench_xla.py: they run on the XLA CPU device threads of an ``XlaWorld``.

Each job is ``fn(ctx, ...)`` on every device thread (``idist.testing._xla_world``); the
threads of one process share this module, so they meet on ``threading`` primitives here
(the sync between timed batches, agreeing on a batch size) without a device collective.

"raw" on this device needs one discipline besides xm calls: XLA's CPU runtime matches a
collective across the device threads of one process by the compiled program (pytorch/xla
#9089): two threads that both compile the same collective wait for each other forever (XLA
aborts the process after 10 s), and unordered syncs of already-cached programs deadlocked
too in our runs. So raw runs the programs computing its results one thread at a time
(``Raw.sync``: ``_xla_sync_multi`` in rank order, then a fresh all-reduce token, as
``torch_xla.sync()`` leaves it): the discipline idist's turnstile keeps, written for raw
code. The xm calls that never met here even so are named where raw works around them.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from typing import Any

import torch

_LOCK = threading.Lock()
_SHARED: dict[int, _Shared] = {}


class _Shared:
    """What the device threads of one world share: a barrier, a slot per rank, a turn."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.barrier = threading.Barrier(n)
        self.slots: list[Any] = [None] * n
        self.turn = 0
        self.cond = threading.Condition()

    def in_turn(self, rank: int, fn: Callable[[], None], timeout: float = 300.0) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.turn == rank, timeout):
                raise TimeoutError(f"rank {rank} waited {timeout} s for its turn to compile")
            try:
                fn()
            finally:
                self.turn = (rank + 1) % self.n
                self.cond.notify_all()


def shared(n: int) -> _Shared:
    """The world of ``n`` device threads in this process (made by the first thread that asks)."""
    with _LOCK:
        return _SHARED[n] if n in _SHARED else _SHARED.setdefault(n, _Shared(n))


class Raw:
    """The raw side of one device thread: run the programs computing some tensors, in turn."""

    def __init__(self, rank: int, n: int) -> None:
        import torch_xla

        self.rank, self.n = rank, n
        self.shared = shared(n)
        self._C = torch_xla._XLAC

    def sync(self, *tensors: torch.Tensor) -> None:
        """Compile (or find) and start the programs computing ``tensors``, one thread at a time.

        What ``torch_xla.sync()`` does for them; after it, every xm collective starts a fresh
        token chain (as after ``torch_xla.sync()``), so the next program holds no old one.
        """
        if not tensors:
            return
        dev = str(tensors[0].device)
        self.shared.in_turn(self.rank, lambda: self._C._xla_sync_multi(list(tensors), devices=[], wait=False))
        self._C._set_all_reduce_token(dev, None)


def compiles() -> int:
    """Programs compiled so far in this process (torch_xla's CompileTime metric: every thread)."""
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def threads_sync(n: int) -> None:
    shared(n).barrier.wait(timeout=300)


def threads_agree(rank: int, n: int, value: int) -> int:
    """The max of ``value`` over the device threads (the same on every thread)."""
    s = shared(n)
    s.slots[rank] = value
    s.barrier.wait(timeout=300)
    out = max(s.slots)
    s.barrier.wait(timeout=300)
    return int(out)


# ------------------------------------------------------------------ workloads
def workloads(ctx: Any, raw: Raw, smoke: bool) -> list[dict[str, Any]]:
    """name -> {"raw": fn, "idist": fn, "check": fn, "reset": fn|None, "target": float}."""
    import torch_xla.core.xla_model as xm

    import _targets
    import idist

    rank, ws, dev = ctx.rank, ctx.world_size, ctx.device
    out: list[dict[str, Any]] = []
    isum = ws * (ws + 1) // 2
    tensor_target, value_target = 1.05, 1.00

    def add(name: str, impls: dict[str, Callable[[], object]], check: Callable[[object], str | None],
            target: float | None, reset: Callable[[], None] | None = None) -> None:  # fmt: skip
        out.append({"name": name, "impls": impls, "check": check, "reset": reset, "target": target})

    # ---- tensor all_reduce of a CPU tensor, in place (raw: to the device, xm.all_reduce, sync, back)
    for n in (1, 1_000) if smoke else (1, 1_000, 64_000, 1_000_000, 16_000_000):
        ts = {i: torch.full((n,), float(rank + 1)) for i in ("raw", "idist")}

        def raw_reduce(t: torch.Tensor = ts["raw"]) -> torch.Tensor:
            r = xm.all_reduce(xm.REDUCE_SUM, t.to(dev))
            raw.sync(r)
            return t.copy_(r.cpu())

        def reset(ts: dict[str, torch.Tensor] = ts) -> None:
            for t in ts.values():
                t.zero_()

        def check_sum(v: object, n: int = n) -> str | None:
            ok = isinstance(v, torch.Tensor) and v.shape == (n,) and bool((v == isum).all())
            return None if ok else f"wrong sum {v!r}"[:200]

        impls = {"raw": raw_reduce, "idist": lambda t=ts["idist"]: idist.all_reduce(t)}
        add(f"all_reduce(tensor[{n:_}])", impls, check_sum, tensor_target, reset)

    # ---- all_gather of equal shapes (raw: xm.all_gather concatenates; split back per rank)
    for n in (1_000,) if smoke else (1_000, 1_000_000):
        t = torch.full((n,), float(rank))

        def raw_gather(t: torch.Tensor = t) -> list[torch.Tensor]:
            g = xm.all_gather(t.to(dev), pin_layout=False)
            raw.sync(g)
            return list(g.cpu().chunk(ws))

        def check_gather(v: object, n: int = n) -> str | None:
            ok = isinstance(v, list) and len(v) == ws
            ok = ok and all(x.shape == (n,) and bool((x.cpu() == k).all()) for k, x in enumerate(v))
            return None if ok else "wrong gather"

        add(f"all_gather(tensor[{n:_}])",
            {"raw": raw_gather, "idist": lambda t=t: idist.all_gather(t)}, check_gather, tensor_target)  # fmt: skip

    # ---- all_gather of shapes that differ by rank (raw: gather the row counts, pad, gather, trim)
    for rows, cols in ((100, 10),) if smoke else ((100, 10), (10_000, 100)):
        tvar = torch.full((rows + 10 * rank, cols), float(rank))

        def raw_ragged(t: torch.Tensor = tvar) -> list[torch.Tensor]:
            counts = xm.all_gather(torch.tensor([t.shape[0]]).to(dev), pin_layout=False)
            raw.sync(counts)
            n_rows = counts.cpu().tolist()
            padded = torch.zeros((max(n_rows), *t.shape[1:]), dtype=t.dtype)
            padded[: t.shape[0]] = t
            g = xm.all_gather(padded.to(dev), pin_layout=False)
            raw.sync(g)
            return [p[:r] for p, r in zip(g.cpu().chunk(ws), n_rows, strict=True)]

        def check_var(v: object, rows: int = rows, cols: int = cols) -> str | None:
            ok = isinstance(v, list) and [tuple(x.shape) for x in v] == [(rows + 10 * k, cols) for k in range(ws)]
            ok = ok and all(bool((x.cpu() == k).all()) for k, x in enumerate(v))
            return None if ok else "wrong gather"

        add(f"all_gather(tensor[{rows}+10r, {cols}], shapes differ)",
            {"raw": raw_ragged, "idist": lambda t=tvar: idist.all_gather(t)}, check_var, tensor_target)  # fmt: skip

    # ---- tensor broadcast into same-shape CPU receivers. xm.collective_broadcast scales each
    # rank's tensor by 1 (root) or 0 and sums them with the in-place, token-chained list form
    # of xm.all_reduce; on this device that form never meets (XLA aborts the process after
    # 10 s), even compiled in turn. raw sends what the sum computes: the root's tensor, zeros
    # elsewhere, through the functional xm.all_reduce.
    for n in (1_000,) if smoke else (1_000, 64_000, 1_000_000):
        src_vals = torch.arange(n, dtype=torch.float32)
        tb = {i: src_vals.clone() if rank == 0 else torch.zeros(n) for i in ("raw", "idist")}

        def raw_bcast(t: torch.Tensor = tb["raw"]) -> torch.Tensor:
            r = xm.all_reduce(xm.REDUCE_SUM, (t if rank == 0 else torch.zeros_like(t)).to(dev))
            raw.sync(r)
            return t.copy_(r.cpu())

        def check_bcast(v: object, src_vals: torch.Tensor = src_vals) -> str | None:
            return None if isinstance(v, torch.Tensor) and torch.equal(v.cpu(), src_vals) else "wrong broadcast"

        impls = {"raw": raw_bcast, "idist": lambda t=tb["idist"]: idist.broadcast(t, src=0)}
        add(f"broadcast(tensor[{n:_}])", impls, check_bcast, tensor_target)

    # ---- Python numbers summed (raw: a float64 / int64 tensor through xm.all_reduce, item())
    def raw_sum(x: float | int, dtype: torch.dtype) -> float | int:
        r = xm.all_reduce(xm.REDUCE_SUM, torch.tensor([x], dtype=dtype).to(dev))
        raw.sync(r)
        return r.cpu().item()

    fsum = sum(0.1 * (k + 1) for k in range(ws))
    add("all_reduce(float)",
        {"raw": lambda: raw_sum(0.1 * (rank + 1), torch.float64), "idist": lambda: idist.all_reduce(0.1 * (rank + 1))},
        lambda v: None if isinstance(v, float) and abs(v - fsum) < 1e-12 else f"got {v!r}", value_target)  # fmt: skip
    add("all_reduce(int)",
        {"raw": lambda: int(raw_sum(rank + 1, torch.int64)), "idist": lambda: idist.all_reduce(rank + 1)},
        lambda v: None if v == isum and type(v) is int else f"got {v!r}", value_target)  # fmt: skip

    # ---- Python values (raw: xm.mesh_reduce's steps: torch.save, xla_rendezvous, torch.load)
    def raw_exchange(obj: object) -> list[object]:
        bio = io.BytesIO()
        torch.save(obj, bio)
        return [torch.load(io.BytesIO(p)) for p in _rendezvous(bio.getvalue(), dev, raw)]

    values = _targets.values(smoke)
    for label, make in values.items():
        mine, expect = make(rank), [make(k) for k in range(ws)]
        add(f"all_gather({label})",
            {"raw": lambda x=mine: raw_exchange(x), "idist": lambda x=mine: idist.all_gather(x)},
            lambda v, e=expect: None if v == e else f"got {v!r}"[:200], value_target)  # fmt: skip
    for label, make in values.items():
        want = make(0)
        mine = want if rank == 0 else None
        add(f"broadcast({label}), None receivers",
            {"raw": lambda x=mine: raw_exchange(x)[0], "idist": lambda x=mine: idist.broadcast(x, src=0)},
            lambda v, w=want: None if v == w and type(v) is type(w) else f"got {v!r}"[:200], value_target)  # fmt: skip

    # ---- barrier (raw: xm.rendezvous's first step, an all_gather of one int, synced)
    def raw_barrier() -> None:
        g = xm.all_gather(torch.zeros(1, dtype=torch.int32).to(dev), pin_layout=False)
        raw.sync(g)
        g.cpu()

    add("barrier", {"raw": raw_barrier, "idist": idist.barrier}, lambda v: None, tensor_target)

    # ---- a training step: an MLP, SGD, one batch per rank (models built on first call)
    steps = {"raw": _train_step(ctx, raw, "raw"), "idist": _train_step(ctx, raw, "idist")}
    add("train step (MLP 32-64-4, SGD, batch 16/rank)", steps,
        lambda v: None if isinstance(v, float) and v == v else f"loss {v!r}", None)  # fmt: skip
    return out


def _train_step(ctx: Any, raw: Raw, impl: str) -> Callable[[], float]:
    """One step of a small model; built on the first call, so that its set-up is counted there.

    raw: the model moved to the device by hand; forward, backward and the gradients'
    concatenation in one program, their sum (one functional ``xm.all_reduce``) in a second,
    the average and ``opt.step()`` in a third. idist: ``auto_model`` +
    ``auto_optim``, ``ctx.step()``. Every rank starts from the same weights.
    """
    import torch_xla.core.xla_model as xm
    from torch import nn

    import idist

    dev = ctx.device
    state: dict[str, Any] = {}

    def build() -> None:
        gen = torch.Generator().manual_seed(0)  # torch's global RNG is shared by the threads
        model: nn.Module = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        if impl == "idist":
            model = idist.auto_model(model)
            opt = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=0.01))
        else:
            model = model.to(dev)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
        data = torch.Generator().manual_seed(1 + ctx.rank)
        state.update(model=model, opt=opt, x=torch.randn(16, 32, generator=data).to(dev),
                     y=torch.randn(16, 4, generator=data).to(dev))  # fmt: skip

    def step() -> float:
        if not state:
            build()
        model, opt = state["model"], state["opt"]
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(state["x"]), state["y"])
        loss.backward()
        if impl == "idist":
            opt.step()
            ctx.step()
        else:
            # xm.optimizer_step's gradient all_reduce is the in-place list form, which never
            # meets on this device (see the broadcast above), nor did a collective sharing its
            # program with other work in our runs: the gradients' concatenation, their sum
            # (functional xm.all_reduce) and the update run as three programs
            grads = [p.grad for p in model.parameters()]
            flat = torch.cat([g.reshape(-1) for g in grads])
            raw.sync(flat, loss)
            summed = xm.all_reduce(xm.REDUCE_SUM, flat)
            raw.sync(summed)
            flat = summed / ctx.world_size
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].reshape(g.shape))
                offset += g.numel()
            opt.step()
            raw.sync(*model.parameters())
        return float(loss.detach().cpu())

    return step


def _rendezvous(payload: bytes, dev: torch.device, raw: Raw) -> list[bytes]:
    """torch_xla 2.9's ``xm.xla_rendezvous``, step for step, with the raw sync.

    One change: its all_gathers run with ``pin_layout=False``. With the default
    (``pin_layout=True``) xm gathers by padding each rank's value by its ordinal and summing,
    so the device threads' programs differ and never meet (XLA aborts the process): the
    rendezvous as shipped cannot run on the multi-thread XLA CPU device.
    """
    import torch_xla.core.xla_model as xm

    # (xla_rendezvous starts with torch_xla.sync(): nothing is pending here)
    data = torch.tensor(list(payload), dtype=torch.uint8)
    size = torch.tensor([data.shape[0]], dtype=torch.int, device=dev)
    sizes = xm.all_gather(size, pin_layout=False)
    max_size = torch.max(sizes)
    raw.sync(sizes, max_size)
    if max_size.item() < 1:
        return [b"" for _ in range(sizes.size()[0])]
    padded = torch.nn.functional.pad(data, (0, int(max_size.item()) - int(size.item()))).to(dev)
    raw_data = xm.all_gather(padded, pin_layout=False)
    parts = torch.split(raw_data, int(max_size.item()))
    payloads = [d[:sz] for d, sz in zip(parts, sizes.cpu(), strict=True)]
    raw.sync(*payloads)
    return [bytes(p.cpu().tolist()) for p in payloads]


# ----------------------------------------------------------------------- jobs
_STATE: dict[int, tuple[Raw, list[dict[str, Any]]]] = {}


def _setup(ctx: Any, smoke: bool) -> tuple[Raw, list[dict[str, Any]]]:
    got = _STATE.get(ctx.rank)
    if got is None:
        torch.set_num_threads(1)
        raw = Raw(ctx.rank, ctx.world_size)
        got = _STATE[ctx.rank] = (raw, workloads(ctx, raw, smoke))
    return got


def names(ctx: Any, smoke: bool) -> list[str]:
    return [w["name"] for w in _setup(ctx, smoke)[1]]


def time_workload(ctx: Any, index: int, opts: dict[str, Any]) -> dict[str, Any]:
    """Check and warm up both, then time raw and idist interleaved."""
    import _harness as h

    _, ws = _setup(ctx, opts["smoke"])
    w = ws[index]
    n = ctx.world_size
    notes: dict[str, str] = {}
    for impl in ("raw", "idist"):
        for k in range(max(1, opts["warmup"])):
            threads_sync(n)
            got = w["impls"][impl]()
            if k == 0:  # the first result is checked (later ones accumulate into the same tensors)
                problem = w["check"](got)
                if problem:
                    notes[impl] = problem
    if w["reset"] is not None:
        w["reset"]()
    inner, times = h.interleave(
        w["impls"], rounds=opts["rounds"], warmup=0, target_s=opts["target_s"],
        sync=lambda: threads_sync(n), agree=lambda v: threads_agree(ctx.rank, n, v), max_inner=opts["max_inner"],
    )  # fmt: skip
    row = {"name": w["name"], "inner": inner, "notes": notes, "target": w["target"], "times_s": times,
           "stats": h.summarise(times, "raw")}  # fmt: skip
    if opts.get("profile"):
        import _targets

        row["profile_calls"] = opts["profile"]
        row["profile"] = {
            i: _targets.profile(fn, opts["profile"], lambda: threads_sync(n)) for i, fn in w["impls"].items()
        }
    if ctx.rank != 0:
        row.pop("profile", None)
    return row


def count_compiles(ctx: Any, impl: str, index: int, calls: int, smoke: bool) -> list[int]:
    """Programs compiled by each of ``calls`` calls of one implementation (process-wide)."""
    _, ws = _setup(ctx, smoke)
    fn = ws[index]["impls"][impl]
    n = ctx.world_size
    counts = []
    for _ in range(calls):
        threads_sync(n)
        before = compiles()
        threads_sync(n)
        fn()
        threads_sync(n)
        counts.append(compiles() - before)
        threads_sync(n)
    return counts
