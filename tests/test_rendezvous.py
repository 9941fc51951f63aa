"""The rendezvous store's client side: it does not pay torch's retry pause for a store that
starts a moment later, and it still gives up on a store that never comes."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from idist._backends.native._rendezvous import _wait_for_server
from multiproc import free_port

pytestmark = pytest.mark.timeout(60)


def test_a_store_that_starts_later_is_found_within_the_probe_interval() -> None:
    port = free_port()
    started: list[float] = []
    server = socket.socket()

    def listen_later() -> None:
        time.sleep(0.5)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen()
        started.append(time.monotonic())

    t = threading.Thread(target=listen_later)
    t.start()
    try:
        _wait_for_server("127.0.0.1", port, 20.0)
        found = time.monotonic()
        t.join()
        assert started, "returned before the store listened"
        assert found - started[0] < 1.0  # found by the probe, not after the 20 s window
    finally:
        t.join()
        server.close()


def test_a_store_that_never_comes_is_given_up_after_the_window() -> None:
    port = free_port()
    start = time.monotonic()
    _wait_for_server("127.0.0.1", port, 0.3)
    assert 0.3 <= time.monotonic() - start < 5.0
