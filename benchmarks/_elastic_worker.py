"""One rank of bench_elastic.py's job: training with a checkpoint every 2 steps, timed.

``_elastic_worker.py OUT crash|stall``: on the first attempt rank 1 raises at step 7 (``crash``,
writing OUT/fail first) or the ranks launched with BENCH_VICTIM=1 stall at step 5 (``stall``;
the benchmark kills their node). On a restart rank 0 writes OUT/start (the script began),
OUT/ready (initialized, checkpoint loaded) and OUT/step (the first step done): time.time() each.
"""

import os
import sys
import time

T0 = time.time()

from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

import idist  # noqa: E402


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    restarted = attempt > 0 or os.environ.get("BENCH_RESUMED") == "1"
    ctx = idist.initialize()
    try:
        g = torch.Generator().manual_seed(3)
        x = torch.randn(480, 5, generator=g)
        data = TensorDataset(x, x @ torch.randn(5, 1, generator=g))
        torch.manual_seed(0)
        model = ctx.auto_model(nn.Sequential(nn.Linear(5, 64), nn.Tanh(), nn.Linear(64, 1)))
        opt = ctx.auto_optim(torch.optim.SGD(model.parameters(), lr=0.01))
        loader = ctx.auto_dataloader(data, batch_size=12, shuffle=True)
        state: dict[str, object] = {"model": model, "optim": opt, "loader": loader, "step": 0}
        if (out / "ckpt").exists():
            ctx.load_checkpoint(out / "ckpt", state)
        step = int(state["step"])  # type: ignore[call-overload]
        if restarted and ctx.rank == 0:
            (out / "start").write_text(repr(T0))
            (out / "ready").write_text(repr(time.time()))
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
            step += 1
            if restarted and ctx.rank == 0 and not (out / "step").exists():
                (out / "step").write_text(repr(time.time()))
            if step % 2 == 0:
                state["step"] = step
                ctx.save_checkpoint(out / "ckpt", state)
            if not restarted and mode == "crash" and step == 7 and ctx.rank == 1:
                (out / "fail").write_text(repr(time.time()))
                raise RuntimeError("injected failure")
            if not restarted and mode == "stall" and step == 5 and os.environ.get("BENCH_VICTIM") == "1":
                (out / f"stalled{ctx.rank}").write_text(str(os.getpid()))
                time.sleep(600)
    finally:
        idist.finalize()


if __name__ == "__main__":
    main()
