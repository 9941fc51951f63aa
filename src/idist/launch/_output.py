"""``idist run``'s output: every rank's stdout and stderr, prefixed, passed on as it comes, never lost.

A thread per stream reads what the rank wrote and writes it to the launcher's stdout or stderr
with ``[rankN]:`` before each line. A line goes out when it ends (``\\n``, or ``\\r``, so a progress
bar moves as it draws); a bar's state, or a prompt of the rank reading the terminal, left
unended for ``HOLD`` seconds goes out as far as it goes; a line of another rank never lands in it.
A slow reader blocks the writes, and the ranks with them: nothing is dropped. A reader that
closed (``| head``) sets ``broken``. Each stream is read to its end, or, once the job is over,
until it stays silent for ``IDLE_AFTER_END``.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import threading
import time

#: seconds an unended line waits for its end before it goes out as far as it goes
HOLD = 0.05
#: once the job is over, how long a stream may stay silent before it is left (a process that
#: detached from the job on purpose may hold it open)
IDLE_AFTER_END = 0.5
_CHUNK = 1 << 16
#: seconds a stream that trickles waits before it is read again
GATHER = 0.002
_BREAK = re.compile(rb"(\r\n|\n|\r)")


class Stream:
    """Where one writer stands in its line: ``prefix`` goes before each line it starts.

    ``echoed``: the rank reads the terminal, which echoes what is typed after a prompt and so
    ends the prompt's line; what the rank writes after a prompt then starts a line of its own.
    """

    def __init__(self, prefix: bytes, echoed: bool = False) -> None:
        self.prefix = prefix
        self.echoed = echoed
        self.at_start = True

    def format(self, data: bytes) -> bytes:
        """``data`` with the prefix before every line it starts (once: a line that already begins
        with it, as torch's own excepthook writes them, keeps one); updates ``at_start``."""
        prefix = self.prefix
        if not prefix or not data:
            if data:
                self.at_start = data.endswith((b"\n", b"\r"))
            return data
        if b"\r" not in data and prefix not in data:  # the common case, without a loop
            joined = data.replace(b"\n", b"\n" + prefix)
            if self.at_start:
                joined = prefix + joined
            self.at_start = data.endswith(b"\n")
            return joined[: -len(prefix)] if self.at_start else joined
        parts = _BREAK.split(data)
        out: list[bytes] = []
        for i in range(0, len(parts), 2):
            text, end = parts[i], parts[i + 1] if i + 1 < len(parts) else b""
            if self.at_start and (text or end[-1:] == b"\n") and not text.startswith(prefix):
                out.append(prefix)  # a bare "\r" (a progress bar's first byte) needs none
            out += (text, end)
            if end or text:
                self.at_start = bool(end)
        return b"".join(out)


class Sink:
    """One of the launcher's own outputs (a descriptor), shared by every stream written to it."""

    def __init__(self, fd: int, broken: threading.Event) -> None:
        self.fd = fd
        self.broken = broken
        self._lock = threading.Lock()
        self._open: Stream | None = None  # the stream whose line is unended here

    def write(self, stream: Stream, data: bytes, prompt: bool = False) -> bool:
        """Write ``data`` of ``stream``; False when the reader is gone (``broken`` is then set).
        ``prompt``: an unended line the rank went quiet on (it may wait for input)."""
        with self._lock:
            if self.broken.is_set():
                return False
            head = b""
            if self._open is not None and self._open is not stream:
                head = b"\n"  # end the other stream's line here; it continues on a line of its own
                self._open.at_start = True
            out = head + stream.format(data)
            self._open = None if stream.at_start else stream
            if prompt and stream.echoed:
                stream.at_start = True  # the echo of the answer ends the line; others still start anew
            try:
                _write_all(self.fd, out)
            except (BrokenPipeError, ConnectionResetError):
                self.broken.set()
                return False
            except OSError:
                return True  # a file that cannot take more (ENOSPC...): the job goes on, as print's would
            return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:  # someone made the file non-blocking: wait until it takes more
            select.select([], [fd], [])


class Pump(threading.Thread):
    """Reads one stream of a rank until its end and writes it to a sink (see the module docstring)."""

    def __init__(self, fd: int, stream: Stream, sink: Sink, ending: threading.Event) -> None:
        super().__init__(name=f"idist-pump-{fd}", daemon=True)
        self.fd = fd
        self.stream = stream
        self.sink = sink
        self._ending = ending

    def run(self) -> None:
        held = b""
        after_cr = False  # the last byte written was "\r": what is held is a progress bar's next state
        quiet_since = time.monotonic()
        try:
            while True:
                # An unended line goes out unended only where it may never end: a progress bar, a
                # prompt of the rank that reads the terminal. Elsewhere it waits for its end (a
                # rank that prints in pieces, and is slowed by the machine, keeps its line whole).
                shows = bool(held) and (after_cr or self.stream.echoed or held.endswith(b"\r"))
                ready, _, _ = select.select([self.fd], [], [], HOLD if shows else 0.25)
                if not ready:
                    if shows:
                        if not self.sink.write(self.stream, held, prompt=True):
                            return
                        held, after_cr = b"", False
                    if self._ending.is_set() and time.monotonic() - quiet_since >= IDLE_AFTER_END:
                        return  # held open by a process that left the job
                    continue
                data = os.read(self.fd, _CHUNK)
                if not data:
                    return
                quiet_since = time.monotonic()
                data = held + data
                # A "\r" at the very end may be the first half of "\r\n": it waits for the next read.
                cut = max(data.rfind(b"\n"), data.rfind(b"\r", 0, len(data) - 1)) + 1
                if cut == 0 and len(data) < _CHUNK:
                    held = data
                    continue
                cut = cut or len(data)
                held = data[cut:]
                after_cr = data[cut - 1 : cut] == b"\r"
                if not self.sink.write(self.stream, data[:cut]):
                    return
                if len(data) < _CHUNK // 4:
                    # a trickle: let it gather for a moment (a rank that prints a line at a time
                    # would otherwise cost a wake-up, a read and a write per line)
                    time.sleep(GATHER)
        finally:
            if held or not self.stream.at_start:
                self.sink.write(self.stream, held + (b"\n" if not held.endswith(b"\n") else b""))
            os.close(self.fd)


class Output:
    """The pumps of one launch, and the launcher's own lines on its stderr."""

    def __init__(self, out_fd: int = 1, err_fd: int = 2) -> None:
        self.broken = threading.Event()
        self.ending = threading.Event()
        self.sinks = (Sink(out_fd, self.broken), Sink(err_fd, self.broken))
        self._me = Stream(b"")
        self.pumps: list[Pump] = []

    def add(self, prefix: bytes, stdout_fd: int, stderr_fd: int, echoed: bool = False) -> None:
        """Pump a rank's stdout and stderr (the read ends; this object closes them); ``echoed``:
        the rank reads the terminal (see ``Stream``)."""
        for fd, sink in zip((stdout_fd, stderr_fd), self.sinks, strict=True):
            pump = Pump(fd, Stream(prefix, echoed), sink, self.ending)
            pump.start()
            self.pumps.append(pump)

    def say(self, text: str) -> None:
        """A line of the launcher's own on its stderr, on a line of its own."""
        with contextlib.suppress(OSError):
            self.sinks[1].write(self._me, (text.rstrip("\n") + "\n").encode())

    def drain(self, stop: threading.Event) -> None:
        """Wait until every stream is read to its end (or left, see ``IDLE_AFTER_END``), as long as
        the reader takes, unless ``stop`` is set meanwhile."""
        self.ending.set()
        for pump in self.pumps:
            while pump.is_alive() and not stop.is_set():
                pump.join(0.1)
