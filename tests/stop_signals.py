"""The stop signals' default dispositions, for a test that stops a process with one.

A shell that starts the test run in the background (no job control) hands SIGINT on
ignored, and nohup hands SIGHUP on ignored; Python then leaves them ignored, as it should
(such a process is meant to be immune to them), in itself and in every child it starts.
A test that sends one and expects the process to stop restores the default first."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


def stop_signals_by_default() -> None:
    """In a child (``preexec_fn``): SIGINT and SIGHUP as a terminal's process has them."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@contextlib.contextmanager
def ctrl_c_raises() -> Iterator[None]:
    """In this process (the main thread): SIGINT raises KeyboardInterrupt, as Python's
    default handler does, until the block ends."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
