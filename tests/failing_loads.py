"""A checkpoint load whose stateful object raises on chosen ranks, and what its report gathers.

Shared by tests/test_bounded_reports.py (the bounds) and benchmarks/probe_scale_reports.py
(the sizes as the world grows): both count at the native backend's ``allgather_bytes``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import idist
from idist import CheckpointError
from idist._backends.native._comm import NativeComm
from idist.testing import simulate


class FailsOnce:
    """A stateful object whose first ``load_state_dict`` raises ``message`` (when there is one)."""

    def __init__(self, message: str | None = None) -> None:
        self.message = message

    def state_dict(self) -> dict[str, int]:
        return {"x": 1}

    def load_state_dict(self, state: dict[str, int]) -> None:
        message, self.message = self.message, None  # putting it back then works
        if message is not None:
            raise ValueError(message)


def counting_gathers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The byte size of every buffer an all_gather brings to a rank, until ``monkeypatch`` undoes it."""
    sizes: list[int] = []
    original = NativeComm.allgather_bytes

    def counting(self: NativeComm, buf: torch.Tensor) -> torch.Tensor:
        out = original(self, buf)
        sizes.append(out.numel())
        return out

    monkeypatch.setattr(NativeComm, "allgather_bytes", counting)
    return sizes


def load_failing(folder: Path, world_size: int, messages: dict[int, str]) -> list[tuple[str, str]]:
    """Every simulated rank's error (type name, text) when rank r's object raises ``messages[r]``
    while loading ``folder`` (written with a ``FailsOnce`` under ``"obj"``); ``("ok", "")`` if none."""

    def fn(ctx: idist.DistContext) -> tuple[str, str]:
        try:
            ctx.load_checkpoint(folder, {"obj": FailsOnce(messages.get(ctx.rank))})
        except CheckpointError as exc:
            return type(exc).__name__, str(exc)
        return "ok", ""

    return simulate(world_size, fn)
