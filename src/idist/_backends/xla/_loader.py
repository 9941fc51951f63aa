"""auto_dataloader on XLA: batches arrive on the device, and a pass is what the model took of it.

torch_xla's ``ParallelLoader`` (what ``MpDeviceLoader`` wraps) reads the CPU loader on a thread
of its own, up to 24 batches ahead of the model, and runs on to the end of the pass when the
model stops early. So the CPU iterator only loads (``_loading_pass``), and ``DevicePass``, the
iterator the model reads, reports each batch and the end of the pass as the model takes them:
a look at one batch changes nothing, ``state_dict()`` counts the batches taken, each batch's
gradient weight is its own, and a dataset error is raised instead of ending the pass early.
A pass dropped early stops its threads.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, final

import torch
from torch.utils.data import Dataset

from ...training._dataloader import AutoDataLoader
from . import _lib

if TYPE_CHECKING:
    from ...training._epochs import Pass
    from ._context import XlaContext

T = TypeVar("T")


class _Parallel(Protocol):
    """What idist uses of torch_xla's ``ParallelLoader`` (which ships no annotations)."""

    def per_device_loader(self, device: torch.device) -> Iterator[Any]: ...

    def close(self) -> None: ...


@final
class _Reader:
    """The CPU iterator as the loading thread reads it: an error is kept for the model's side, where
    it is raised, instead of ending the pass there (torch_xla's thread would end it silently)."""

    def __init__(self, it: Iterator[object]) -> None:
        self.it = it
        self.error: BaseException | None = None

    def __iter__(self) -> _Reader:
        return self

    def __next__(self) -> object:
        try:
            return next(self.it)
        except StopIteration:
            raise
        except BaseException as exc:
            self.error = exc
            raise StopIteration from None


def _close_soon(parallel: _Parallel) -> None:
    """Stop a dropped pass's threads without waiting for the batch one may be loading (nor joining
    itself, when the garbage collector runs on one of them)."""
    threading.Thread(target=parallel.close, name="idist-xla-loader-close", daemon=True).start()


@final
class DevicePass(Iterator[T]):
    """One pass of an ``XlaDeviceLoader``: its batches on the device, counted as the model takes them."""

    def __init__(self, loader: XlaDeviceLoader[T]) -> None:
        from torch_xla.distributed.parallel_loader import ParallelLoader  # loaded on first iteration only

        if loader.persistent_workers and loader._reading is not None:
            loader._reading.close()  # its thread reads the workers' iterator this pass reuses
        self._loader = loader
        self._pass: Pass
        self._pass, cpu = loader._loading_pass()
        self._reader = _Reader(cpu)
        make = cast("Callable[[Iterable[object], list[torch.device]], _Parallel]", ParallelLoader)
        self._parallel = make(self._reader, [loader.xla_device])
        if loader.persistent_workers:
            loader._reading = self._parallel
        self._device = self._parallel.per_device_loader(loader.xla_device)
        self._stop = weakref.finalize(self, _close_soon, self._parallel)
        self._stop.atexit = False

    def __iter__(self) -> DevicePass[T]:
        return self

    def __len__(self) -> int:
        return len(self._loader)

    def __next__(self) -> T:
        try:
            data: T = next(self._device)
        except StopIteration:
            self._stop.detach()
            self._parallel.close()  # its threads are done: the queue ran dry
            error, self._reader.error = self._reader.error, None
            if error is not None:
                self._pass.done = True  # a pass that failed does not count, as one left early
                raise error from None
            self._pass.end()
            raise
        return self._pass.batch(data)


class XlaDeviceLoader(AutoDataLoader[T]):
    """An ``AutoDataLoader`` whose batches arrive on the XLA device (torch_xla's ``ParallelLoader``).

    Rebuilt from its public attributes (ignite's ``update_dataloader``), it keeps its device.
    """

    def __init__(self, dataset: Dataset[T], *, xla_device: torch.device | None = None, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        if xla_device is None:
            _lib.load()
            xla_device = _lib.torch_xla.device()
        self.xla_device = xla_device
        #: the device loader of the last pass (a new pass over persistent workers stops it first)
        self._reading: _Parallel | None = None

    def __iter__(self) -> DevicePass[T]:  # type: ignore[override]  # the device pass, not torch's iterator
        return DevicePass(self)


def adapt_loader(ctx: XlaContext, loader: AutoDataLoader[T]) -> AutoDataLoader[T]:
    loader.__class__ = XlaDeviceLoader
    assert isinstance(loader, XlaDeviceLoader)
    loader.xla_device, loader._reading = ctx.device, None
    return loader
