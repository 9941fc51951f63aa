"""FSDP and checkpoints through idist vs the same code written with torch alone, on 2 gloo ranks.

    .venv/bin/python benchmarks/bench_sharding.py [--rounds 9] [--width 1024] [--depth 10]

- ``fsdp step``: zero_grad + forward + backward + AdamW step of an MLP of ``depth`` square
  ``width`` layers (10.5 M parameters by default), sharded by ``auto_model(strategy="fsdp")``
  vs ``fully_shard`` applied by hand to each layer and the root (target ≤ 1.05x).
- ``save`` / ``load``: ``save_checkpoint`` / ``load_checkpoint`` of that model and its Adam
  state vs ``get_state_dict`` + ``dcp.save`` and ``dcp.load`` + ``set_state_dict`` into a
  folder of their own (target ≤ 1.1x). idist's save also checks what is at its path,
  stages under its own nonce with a lock file and publishes atomically (a rename, then the
  removal of the replaced checkpoint in a thread); its load holds the folder open, reads the
  manifest, the metadata and the values through its restricted unpickler, compares the keys
  and the save each rank read first, then reads into the live tensors.
- ``memory``: the parameter and optimizer-state bytes each rank holds under FSDP vs DDP
  (target ≤ 0.6x), counted from the tensors.

Both implementations run in the same process launch, alternating each round (``_harness``).
Prints Markdown tables; writes ``benchmarks/out/sharding.json``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness as h

IMPLS = ("torch", "idist")


def _mlp(width: int, depth: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)))


def _bytes(model: Any, opt: Any) -> tuple[int, int]:
    """Bytes of the parameters and of the optimizer state this rank holds."""
    import torch
    from torch.distributed.tensor import DTensor

    def local(t: torch.Tensor) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    params = sum(local(p) for p in model.parameters())
    state = sum(local(v) for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    return params, state


def _workloads(width: int, depth: int, folder: str) -> tuple[list[h.Workload], dict[str, Any]]:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    import idist

    ctx = idist.current()  # adopts the group this worker initialized
    mesh = DeviceMesh.from_group(dist.group.WORLD, device_type="cpu")
    hand = _mlp(width, depth)
    for layer in hand:
        fully_shard(layer, mesh=mesh)
    fully_shard(hand, mesh=mesh)
    auto = ctx.auto_model(_mlp(width, depth), strategy="fsdp")
    opts = {
        "torch": torch.optim.AdamW(hand.parameters(), lr=1e-4),
        "idist": torch.optim.AdamW(auto.parameters(), lr=1e-4),
    }
    models = {"torch": hand, "idist": auto}
    x = torch.randn(64, width, generator=torch.Generator().manual_seed(ctx.rank))

    def step(impl: str) -> float:
        model, opt = models[impl], opts[impl]
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return float(loss.detach())

    for impl in IMPLS:
        step(impl)  # Adam state exists before anything is saved or counted
    raw_path, idist_path = os.path.join(folder, "raw"), os.path.join(folder, "idist")

    def raw_save() -> None:
        msd, osd = get_state_dict(hand, opts["torch"])
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=raw_path, process_group=dist.group.WORLD)

    def raw_load() -> None:
        msd, osd = get_state_dict(hand, opts["torch"])
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=raw_path, process_group=dist.group.WORLD)
        set_state_dict(hand, opts["torch"], model_state_dict=state["model"], optim_state_dict=state["optim"])

    def idist_save() -> None:
        ctx.save_checkpoint(idist_path, {"model": auto, "optim": opts["idist"]})

    def idist_load() -> None:
        ctx.load_checkpoint(idist_path, {"model": auto, "optim": opts["idist"]})

    ddp = DistributedDataParallel(_mlp(width, depth), process_group=dist.group.WORLD)
    ddp_opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    ddp_opt.zero_grad()
    ddp(x).pow(2).mean().backward()
    ddp_opt.step()
    memory = {"fsdp": _bytes(auto, opts["idist"]), "ddp": _bytes(ddp, ddp_opt)}
    params = sum(p.numel() for p in auto.parameters())
    raw_save(), idist_save()  # the folders exist before the first timed load
    workloads = [
        h.Workload(
            f"fsdp step ({params / 1e6:.1f} M parameters, batch 64/rank)", {i: lambda i=i: step(i) for i in IMPLS}
        ),
        h.Workload("save (model + AdamW state)", {"torch": raw_save, "idist": idist_save}),
        h.Workload("load (model + AdamW state)", {"torch": raw_load, "idist": idist_load}),
    ]
    return workloads, {"memory": memory, "parameters": params}


def _rank(rank: int, ws: int, rounds: int, width: int, depth: int, folder: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # 2 ranks on a shared machine: no intra-op thread oversubscription
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    try:
        workloads, facts = _workloads(width, depth, folder)
        rows = []
        for w in workloads:
            inner, times = h.interleave(
                w.impls, rounds=rounds, warmup=1, target_s=0.3, sync=h.dist_sync, agree=h.dist_agree, max_inner=20
            )
            rows.append({"name": w.name, "inner": inner, "times": times})
        return {"rows": rows, **facts}
    finally:
        dist.destroy_process_group()


def main() -> None:
    p = h.parser(__doc__, target_ms=300)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--depth", type=int, default=10)
    args = p.parse_args()
    folder = tempfile.mkdtemp(prefix="idist-bench-sharding-")
    try:
        results = h.run_ranks(
            _rank, args.world_size, args.world_size, args.rounds, args.width, args.depth, folder, timeout=3600
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rows = [{"name": r["name"], "stats": h.summarise(r["times"], "torch"), "notes": {}} for r in results[0]["rows"]]
    print(h.table(f"sharding and checkpoints, {args.world_size} gloo ranks", rows, IMPLS, "torch"))
    print(f"\n### per-rank memory, {results[0]['parameters'] / 1e6:.1f} M parameters + AdamW state\n")
    print("| rank | DDP params + state | FSDP params + state | FSDP / DDP |\n|---|---|---|---|")
    for rank, r in enumerate(results):
        ddp, fsdp = sum(r["memory"]["ddp"]), sum(r["memory"]["fsdp"])
        print(f"| {rank} | {ddp / 2**20:.1f} MiB | {fsdp / 2**20:.1f} MiB | {fsdp / ddp:.2f}x |")
    payload = {"env": h.environment(), "args": vars(args), "rows": rows, "memory": [r["memory"] for r in results]}
    print(f"\nwrote {h.write_json('sharding', payload)}")


if __name__ == "__main__":
    main()
