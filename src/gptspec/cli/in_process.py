"""What the worker process contains, kept as far as one process can (``gptspec conformance
--no-isolate``, where the backend runs in the judge's own process): a backend's
``os._exit`` becomes SystemExit (that check's error, not the end of the run with the
backend's exit status); a watchdog ends the run in one line when a check outlives its time
limit because the in-process timer could not stop it (a backend that blocks SIGALRM, or a
call into compiled code that does not return but lets go of the GIL); threads the backend
leaves running do not keep the process alive after the run. Compiled code that holds the
GIL, or exits through the C library, is beyond any of this: that is what --isolate is for.
"""

from __future__ import annotations

import os
import posix
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# past the time limit, what the timer needs to stop a check and the runner to report it
GRACE_S = 5.0


class InProcessGuard:
    """A context for running a backend's code in this process; ``progress()`` after each
    finished check restarts the watchdog's clock; ``on_expiry(seconds)`` writes what can be
    saved before the process ends."""

    def __init__(self, timeout: float | None, on_expiry: Callable[[float], None]) -> None:
        self.timeout, self.on_expiry = timeout, on_expiry
        self.last = time.monotonic()
        self.done = threading.Event()
        self.judge = os.getpid()
        self.real_exit = os._exit
        self.threads_before: set[threading.Thread] = set()

    def progress(self) -> None:
        self.last = time.monotonic()

    def _exit(self, code: int = 0) -> Any:
        if os.getpid() != self.judge:  # a child the backend forked exits as it asks
            self.real_exit(code)
        raise SystemExit(f"os._exit({code!r}) was called in the judge's process (--no-isolate)")

    def __enter__(self) -> InProcessGuard:
        self.threads_before = set(threading.enumerate())
        os._exit = posix._exit = self._exit  # type: ignore[assignment]
        self.progress()
        if self.timeout is not None:
            threading.Thread(target=self._watch, name="gptspec-watchdog", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        os._exit = posix._exit = self.real_exit

    def _watch(self) -> None:
        assert self.timeout is not None
        limit = self.timeout + max(GRACE_S, self.timeout / 10)
        while not self.done.wait(1.0):
            waited = time.monotonic() - self.last
            if waited > limit:
                try:
                    self.on_expiry(waited)
                finally:
                    for stream in (sys.stdout, sys.stderr):
                        try:
                            stream.flush()
                        except (OSError, ValueError):
                            pass
                    self.real_exit(1)

    def stray_threads(self) -> list[threading.Thread]:
        """Threads the backend started and left running, which Python waits for at exit."""
        return [t for t in threading.enumerate() if t.is_alive() and not t.daemon
                and t not in self.threads_before and t is not threading.main_thread()]
