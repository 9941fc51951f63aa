"""idist's log lines reach ``sys.stderr`` as it is when they are written: pytest's ``capsys``
(as pytorch-ignite's own ``test_no_distrib`` uses it), a redirection, a stream swapped later."""

from __future__ import annotations

import contextlib
import io
import logging

import pytest

import idist


def test_show_config_reaches_capsys(capsys: pytest.CaptureFixture[str]) -> None:
    idist.show_config()
    err = capsys.readouterr().err
    assert "idist.config INFO: distributed configuration: serial (SerialContext)" in err, err
    assert "world size: 1" in err and "rank: 0" in err, err


def test_show_config_follows_a_stream_swapped_after_import() -> None:
    for _ in range(2):  # a new stream each time: the line goes where stderr is now
        swapped = io.StringIO()
        with contextlib.redirect_stderr(swapped):
            idist.show_config()
        assert "distributed configuration: serial" in swapped.getvalue()


def test_the_applications_own_handler_gets_the_record_instead(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []

    class Mine(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    mine = Mine()
    logger = logging.getLogger("idist.config")
    logger.addHandler(mine)
    try:
        idist.show_config()
    finally:
        logger.removeHandler(mine)
    assert len(seen) == 1 and seen[0].startswith("distributed configuration: serial"), seen
    assert "distributed configuration" not in capsys.readouterr().err  # once, through the application's handler
