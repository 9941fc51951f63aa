"""``idist run``'s output formatting, in process: where the ``[rankN]:`` prefixes go, line by line and
across the pieces a stream arrives in, and how a line of one rank is kept out of another's."""

from __future__ import annotations

import os
import threading

import pytest

from idist.launch._output import Sink, Stream


@pytest.mark.parametrize(
    ("pieces", "out"),
    [
        ([b"a\nb\n"], b"[r0]:a\n[r0]:b\n"),
        ([b"a", b"bc\n"], b"[r0]:abc\n"),  # an unended line continues without a second prefix
        ([b"\n"], b"[r0]:\n"),  # an empty line is a line
        ([b"a\r\nb\r\n"], b"[r0]:a\r\n[r0]:b\r\n"),
        ([b"\r", b" 10%\r", b" 20%\r", b"100%\n"], b"\r[r0]: 10%\r[r0]: 20%\r[r0]:100%\n"),  # a progress bar
        ([b"[r0]: Traceback\n[r0]:   x\nplain\n"], b"[r0]: Traceback\n[r0]:   x\n[r0]:plain\n"),  # prefixed already
    ],
)
def test_each_line_gets_one_prefix(pieces: list[bytes], out: bytes) -> None:
    stream = Stream(b"[r0]:")
    assert b"".join(stream.format(p) for p in pieces) == out


def _sink() -> tuple[Sink, int, threading.Event]:
    r, w = os.pipe()
    broken = threading.Event()
    return Sink(w, broken), r, broken


def test_a_line_of_another_rank_never_lands_inside_an_unended_one() -> None:
    sink, r, _ = _sink()
    a, b = Stream(b"[a]:"), Stream(b"[b]:")
    sink.write(a, b"name? ")
    sink.write(b, b"hello\n")
    sink.write(a, b"bob\n")
    os.close(sink.fd)
    assert os.read(r, 1000) == b"[a]:name? \n[b]:hello\n[a]:bob\n"


def test_after_a_prompt_a_rank_that_reads_the_terminal_starts_a_new_line() -> None:
    sink, r, _ = _sink()
    reads = Stream(b"[a]:", echoed=True)
    sink.write(reads, b"(Pdb) ", prompt=True)  # the terminal echoes the answer, ending this line
    sink.write(reads, b"42\n")
    os.close(sink.fd)
    assert os.read(r, 1000) == b"[a]:(Pdb) [a]:42\n"


def test_a_reader_that_went_away_breaks_the_sink() -> None:
    sink, r, broken = _sink()
    os.close(r)
    assert sink.write(Stream(b"[a]:"), b"x\n") is False
    assert broken.is_set()
    assert sink.write(Stream(b"[b]:"), b"y\n") is False
    os.close(sink.fd)
