"""The context stack against a model: initialize / finalize / ``context`` / ``use``, nesting,
exceptions inside a block, and what other threads see."""

from __future__ import annotations

import contextvars
import threading
from contextlib import AbstractContextManager
from typing import Any

import attrs
import torch.distributed as dist
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from torch._C._distributed_c10d import HashStore

import idist
from idist import DistContext, NativeContext, SerialContext

BACKENDS = st.sampled_from(["serial", "serial", "serial", "gloo"])


class Boom(Exception):
    pass


@attrs.define
class Scope:
    ctx: DistContext
    manager: AbstractContextManager[DistContext]
    owns: bool


def _in_thread(fn: Any) -> Any:
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(fn()))
    t.start()
    t.join(30)
    assert not t.is_alive() and box, "the probe thread did not finish"
    return box[0]


class ContextStack(RuleBasedStateMachine):
    """Model: the process default, the scoped stack of this thread, and the live torch group."""

    def __init__(self) -> None:
        super().__init__()
        assert idist.current().backend == "serial", "the stack must start empty"
        self.default: DistContext | None = None
        self.stack: list[Scope] = []
        self.native: NativeContext | None = None  # the idist context owning torch's default group
        self.user_torch = False  # torch's default group was initialized by the user, not idist
        self.closed: list[DistContext] = []

    # ----------------------------------------------------------- helpers
    def _creating(self, backend: str, extra_default: bool) -> str | None:
        """The error the model expects when creating ``backend`` now, or None."""
        if extra_default:
            return "AlreadyInitializedError"
        if backend == "gloo" and (self.native is not None or self.user_torch):
            return "AlreadyInitializedError"
        return None

    def _born(self, ctx: DistContext) -> None:
        if isinstance(ctx, NativeContext):
            self.native = ctx

    def _died(self, ctx: DistContext) -> None:
        assert ctx.closed
        self.closed.append(ctx)
        if ctx is self.native:
            self.native = None

    def _expected(self) -> DistContext | None:
        if self.stack:
            return self.stack[-1].ctx
        return self.default

    def _check_process_level(self, got: DistContext) -> None:
        """What a thread with no scoped context sees: the default, else the user's torch
        group (adopted), else serial; never a group an idist context created elsewhere."""
        if self.default is not None:
            assert got is self.default
        elif self.user_torch:
            assert isinstance(got, NativeContext) and got.process_group is dist.group.WORLD
        else:
            assert isinstance(got, SerialContext) and not got.closed

    # -------------------------------------------------------------- rules
    @rule(backend=BACKENDS)
    def initialize(self, backend: str) -> None:
        expect = self._creating(backend, extra_default=self.default is not None)
        try:
            ctx = idist.initialize(backend)
        except idist.AlreadyInitializedError:
            assert expect == "AlreadyInitializedError"
            return
        assert expect is None
        assert ctx.backend == backend and not ctx.closed
        self.default = ctx
        self._born(ctx)

    @precondition(lambda self: self.native is None and not self.user_torch)
    @rule()
    def user_initializes_torch(self) -> None:
        dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
        self.user_torch = True

    @precondition(lambda self: self.user_torch)
    @rule()
    def user_destroys_torch(self) -> None:
        dist.destroy_process_group()
        self.user_torch = False

    @rule()
    def finalize(self) -> None:
        idist.finalize()
        if self.default is not None:
            self._died(self.default)
        self.default = None

    @rule(backend=BACKENDS)
    def enter_context(self, backend: str) -> None:
        expect = self._creating(backend, extra_default=False)
        manager = idist.context(backend)
        try:
            ctx = manager.__enter__()
        except idist.AlreadyInitializedError:
            assert expect == "AlreadyInitializedError"
            return
        assert expect is None
        self.stack.append(Scope(ctx, manager, owns=True))
        self._born(ctx)

    @rule(which=st.sampled_from(["default", "top", "closed"]))
    def enter_use(self, which: str) -> None:
        pool = {
            "default": [self.default] if self.default is not None else [],
            "top": [self.stack[-1].ctx] if self.stack else [],
            "closed": self.closed[-1:],
        }[which]
        if not pool:
            return
        manager = idist.use(pool[0])
        ctx = manager.__enter__()
        assert ctx is pool[0]
        self.stack.append(Scope(ctx, manager, owns=False))

    @precondition(lambda self: bool(self.stack))
    @rule(raising=st.booleans())
    def exit_block(self, raising: bool) -> None:
        scope = self.stack.pop()
        if raising:
            try:
                raise Boom
            except Boom as exc:
                swallowed = scope.manager.__exit__(Boom, exc, exc.__traceback__)
            assert not swallowed, "a context block must not swallow the exception"
        else:
            scope.manager.__exit__(None, None, None)
        if scope.owns:
            self._died(scope.ctx)
        else:
            assert scope.ctx.closed == (scope.ctx in self.closed)

    # --------------------------------------------------------- invariants
    @invariant()
    def current_is_the_innermost(self) -> None:
        expected = self._expected()
        got = idist.current()
        if expected is None:
            self._check_process_level(got)
        else:
            assert got is expected
        if got.closed:
            try:
                idist.all_reduce(1)
            except idist.ContextClosedError:
                pass
            else:
                raise AssertionError("a closed context must refuse collectives")
        else:
            assert idist.all_reduce(2) == 2 and idist.get_world_size() == 1

    @invariant()
    def other_threads_see_only_the_process_state(self) -> None:
        """A new thread never sees this thread's scoped contexts; a copied contextvars context does."""
        self._check_process_level(_in_thread(idist.current))
        mine = contextvars.copy_context()
        carried = _in_thread(lambda: mine.run(idist.current))
        if self.stack:
            assert carried is self.stack[-1].ctx

    def teardown(self) -> None:
        while self.stack:
            self.stack.pop().manager.__exit__(None, None, None)
        idist.finalize()
        if self.user_torch:
            dist.destroy_process_group()
        assert not dist.is_initialized(), "idist left torch's default group behind"


ContextStack.TestCase.settings = settings(max_examples=25, stateful_step_count=12)
TestContextStack = ContextStack.TestCase
