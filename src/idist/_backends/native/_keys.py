"""Where a context's keys live in the store, so that the store does not grow.

A context's keys live under its namespace ``idist/<attempt>/<generation>``: the attempt is
torchrun's restart count, the generation counts this rank's contexts on this store (every rank
creates its contexts in the same order, so all agree without a round trip). A subgroup's keys
live under a fixed-length hash of its rank list, and the rendezvous keys gloo writes for it are
deleted once every member has built it. The last rank to close a context deletes the keys of
the namespace (``farewell``). See docs/scale.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Protocol, cast

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Store

from ... import _netif
from ._pulse import read1
from ._tally import _Appends
from ._verdict import bounded

#: gloo connects lazily under this variable, reading the rendezvous keys later
_LAZY_GLOO = "TORCH_GLOO_LAZY_INIT"


def attempt(env: Mapping[str, str]) -> str:
    """This launch attempt (torchrun's agent keeps its store across restarts)."""
    return env.get("TORCHELASTIC_RESTART_COUNT", "0")


def join_prefix(env: Mapping[str, str]) -> str:
    return f"idist/{attempt(env)}/join"


def namespace(store: Store, rank: int, env: Mapping[str, str]) -> str:
    """This context's namespace: ``idist/<attempt>/<generation>`` (one request)."""
    root = f"idist/{attempt(env)}"
    return f"{root}/{store.add(f'{root}/gen/{rank}', 1)}"


def group_key(ranks: Sequence[int]) -> str:
    """A subgroup's name in the store: 16 hex digits of a hash of its ranks, whatever its size."""
    return "g" + hashlib.blake2b(",".join(map(str, ranks)).encode(), digest_size=8).hexdigest()


def built(store: Store, size: int) -> None:
    """Called by every member of a gloo group right after building it over ``store`` (its own
    prefix): the last member deletes the addresses gloo left there, which nobody reads again."""
    if os.environ.get(_LAZY_GLOO, "0") not in ("", "0"):
        return  # pairs connect on first use, reading these keys then
    if store.add("built", 1) == size:
        for key in (*(f"0/{r}" for r in range(size)), "built"):
            store.delete_key(key)


class _Beat(Protocol):
    @property
    def keys(self) -> list[str]: ...
    @property
    def clean(self) -> bool: ...


def farewell(store: Store, ns: str, world_size: int, written: Sequence[str], beat: _Beat | None) -> None:
    """Called by every rank as its context closes: the last to close deletes the keys the guard
    ``written`` and the heartbeat ``beat`` wrote (names under ``ns``; every rank lists what its
    guard wrote, which covers groups the last rank is not in) and the counter itself.
    Nothing after a loss (that namespace is never reused); each step bounded (the store may be gone)."""
    if beat is not None and not beat.clean:
        return
    keys = [*written, *(f"live/{k}" for k in (beat.keys if beat is not None else ()))]

    def last() -> None:
        # a rank names what it wrote for groups that the last to close may not be in (one request)
        cast(_Appends, store).append(f"{ns}/written", "".join(f"{k}\n" for k in written))
        if store.add(f"{ns}/closed", 1) != world_size:
            return
        listed = (read1(store, f"{ns}/written") or b"").decode().splitlines()
        for key in (*dict.fromkeys([*keys, *listed]), "written", "closed"):
            with contextlib.suppress(RuntimeError):
                store.delete_key(f"{ns}/{key}")

    bounded(last, 1.0)


def address(store: Store) -> tuple[str, int] | None:
    """The host and port of the TCPStore under ``store`` (through prefix stores), or None."""
    for _ in range(16):
        host, port = getattr(store, "host", None), getattr(store, "port", None)
        if isinstance(host, str) and isinstance(port, int):
            return host, port
        inner = getattr(store, "underlying_store", None)
        if not isinstance(inner, Store):
            return None
        store = inner
    return None


def served_here(host: str) -> bool | None:
    """Whether ``host`` is an address of this machine (None: it does not resolve here)."""
    try:
        addrs = _netif.resolve(host)
    except _netif.NetifError:
        return None
    mine = {a for v in _netif.interface_addresses().values() for a in v}
    return all(_netif.is_loopback_address(a) or a in mine for a in addrs)


def serving_node(store: Store, node: int, device: torch.device) -> int | None:
    """The node whose machine serves ``store`` (one small all_reduce over the default group, which
    every rank just initialized: a store that torchrun's agent serves may be on any node). None
    when no node does (a store outside the job, or one that names no address)."""
    at = address(store)
    mine = node if at is not None and served_here(at[0]) else -1
    found = torch.tensor([mine], dtype=torch.int64, device=device)
    dist.all_reduce(found, op=dist.ReduceOp.MAX)
    return int(found.item()) if found.item() >= 0 else None
