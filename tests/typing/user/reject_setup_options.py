"""#35 item 5: without a backend (or with a name known only when it runs) the backend may be serial,
which takes no options."""

from __future__ import annotations

import idist


def checked_without_backend() -> None:
    # rejected: mypy[call-overload] pyright[reportCallIssue]
    idist.initialize(checked=True)


def timeout_without_backend() -> None:
    # rejected: mypy[call-overload] pyright[reportCallIssue]
    with idist.context(timeout=5.0):
        pass


def timeout_with_a_str(name: str) -> None:
    # rejected: mypy[call-overload] pyright[reportCallIssue,reportArgumentType]
    idist.initialize(name, timeout=5.0)


def local_rank_flag() -> None:
    # rejected: mypy[deprecated] pyright[reportDeprecated]
    idist.set_local_rank(True)


def serial_takes_none() -> None:
    # rejected: mypy[call-overload] pyright[reportArgumentType]
    idist.initialize("serial", liveness=1.0)
