"""Type tests for the Horovod backend: checked by mypy (strict, warn_unused_ignores), never executed."""

from __future__ import annotations

from typing import assert_type, final

import torch

import idist
from idist import HorovodContext, ModelName, NativeContext


def horovod_is_selected_statically() -> None:
    assert_type(idist.initialize("horovod"), HorovodContext)
    with idist.context("horovod") as ctx:
        assert_type(ctx, HorovodContext)
    idist.spawn("hvd", lambda local_rank: local_rank)  # type: ignore[call-overload]
    idist.initialize("horovod", timeout=60.0)
    idist.context("horovod", timeout=None)
    idist.initialize("horovod", rank=0)  # type: ignore[call-overload]


def auto_optim_takes_horovods_options(h: HorovodContext, m: torch.nn.Module, opt: torch.optim.SGD) -> None:
    h.auto_optim(opt, op="ADASUM", backward_passes_per_step=4, named_parameters=m.named_parameters())
    idist.auto_optim(opt, gradient_predivide_factor=2.0, sparse_as_dense=True, num_groups=2)
    assert_type(idist.auto_optim(opt, op=1, groups=[[p for p in m.parameters()]]), torch.optim.SGD)
    h.auto_optim(opt, lr=0.1)  # type: ignore[call-overload]
    idist.auto_optim(opt, op="MEAN")  # type: ignore[arg-type]
    idist.auto_optim(opt, backward_passes_per_step="4")  # type: ignore[arg-type]


def adasum_type_checks_on_horovod_only(hctx: HorovodContext, nctx: NativeContext, t: torch.Tensor) -> None:
    assert_type(hctx.all_reduce(t, "ADASUM"), torch.Tensor)
    assert_type(hctx.all_reduce(t, op="ADASUM", group=[0, 1]), torch.Tensor)
    assert_type(hctx.all_reduce(1.5, "AVERAGE"), float)
    assert_type(hctx.all_reduce(3), int)
    assert_type(hctx.all_reduce(True, "AND"), bool)
    assert_type(hctx.all_gather(t), list[torch.Tensor])
    assert_type(hctx.broadcast("s" if hctx.rank == 0 else None), str | None)
    nctx.all_reduce(t, "ADASUM")  # type: ignore[call-overload]
    idist.all_reduce(t, "ADASUM")  # type: ignore[call-overload]
    hctx.all_reduce(t, "MEAN")  # type: ignore[call-overload]
    hctx.all_reduce("text")  # type: ignore[call-overload]


def horovod_context_is_final_and_frozen(hctx: HorovodContext) -> None:
    assert_type(hctx.model_name(), ModelName)
    hctx.rank = 3  # type: ignore[misc]


class _Sub(HorovodContext):  # type: ignore[misc]
    pass


@final
class _Probe:
    def uses_stubs(self) -> None:
        import horovod.torch as hvd

        assert_type(hvd.rank(), int)
        assert_type(hvd.allreduce_(torch.ones(1), op=hvd.Sum), torch.Tensor)
        opt = hvd.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1))
        assert_type(opt, torch.optim.SGD)
        ps = hvd.add_process_set([0, 1])
        assert_type(ps, hvd.ProcessSet)
        assert_type(hvd.allgather_object({"a": 1}), list[dict[str, int]])
