"""What the worker process contains, kept as far as one process can (``gptspec conformance
--no-isolate``, where the backend runs in the judge's own process): a backend's
``os._exit`` becomes SystemExit (that check's error, not the end of the run with the
backend's exit status); a watchdog ends the run in one line when a check outlives its time
limit because the in-process timer could not stop it (a backend that blocks SIGALRM, or a
call into compiled code that does not return but lets go of the GIL); threads the backend
leaves running, and exit handlers it registers that do not return within the time limit,
do not keep the process alive after the run. Compiled code that holds the
GIL, or exits through the C library, is beyond any of this: that is what --isolate is for.
"""

from __future__ import annotations

import atexit
import os
import posix
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gptspec.conformance.processes import Adoption

# past the time limit, what the timer needs to stop a check and the runner to report it
GRACE_S = 5.0


class InProcessGuard:
    """A context for running a backend's code in this process; ``progress()`` after each
    finished check restarts the watchdog's clock; ``on_expiry(seconds)`` writes what can be
    saved before the process ends."""

    def __init__(self, timeout: float | None, on_expiry: Callable[[float], None],
                 mode: str = "--no-isolate") -> None:
        self.timeout, self.on_expiry, self.mode = timeout, on_expiry, mode
        self.last = time.monotonic()
        self.done = threading.Event()
        self.judge = os.getpid()
        self.real_exit = os._exit
        self.threads_before: set[threading.Thread] = set()
        self.adoption: Adoption | None = None
        self.exit_called: object = None  # os._exit's code, until the check's result takes it
        self.unraisable_before = sys.unraisablehook
        self.exit_handlers_before = 0
        self.watchdog: threading.Thread | None = None

    def progress(self) -> None:
        self.last = time.monotonic()

    def _exit(self, code: int = 0) -> Any:
        if os.getpid() != self.judge or self.done.is_set():
            # a child the backend forked, or an exit handler it registered (bound to this
            # function) called after the run: the exit it asks for
            self.real_exit(code)
        # kept: in a finalizer Python ignores the SystemExit, and the check would pass
        self.exit_called = code
        raise SystemExit(f"os._exit({code!r}) was called in the judge's process ({self.mode})")

    def __enter__(self) -> InProcessGuard:
        from gptspec.conformance.processes import adopt_orphans

        self.threads_before = set(threading.enumerate())
        self.exit_handlers_before = atexit._ncallbacks()
        # the processes the backend forks (and those they leave in sessions of their own)
        # are the judge's to end: one asleep with our stdout open kept `… | cat` waiting
        self.adoption = adopt_orphans()
        sys.unraisablehook = self._unraisable
        os._exit = posix._exit = self._exit  # type: ignore[assignment]
        self.progress()
        if self.timeout is not None:
            self.watchdog = threading.Thread(target=self._watch, name="gptspec-watchdog",
                                             daemon=True)
            self.watchdog.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        os._exit = posix._exit = self.real_exit
        sys.unraisablehook = self.unraisable_before
        self.end_children()

    def _unraisable(self, unraisable: Any) -> None:
        """What a backend raised where Python ignores it (a finalizer): one escaped line
        marked as the backend's, where Python would print a traceback."""
        from gptspec.conformance.protocol import CheckTimeout, shown

        err = unraisable.exc_value
        if isinstance(err, KeyboardInterrupt):  # Ctrl-C or SIGTERM: the command's to handle
            self.unraisable_before(unraisable)
            return
        if isinstance(err, CheckTimeout):  # the judge's own timer, fired (each second) in a
            return  # finalizer: the check's time-out says so, not a line per repeat
        what = shown(unraisable.exc_type.__name__)
        message = shown(err) if err is not None else ""
        print(f"  backend output: {what}{': ' + message if message else ''} "
              "(raised in a finalizer: Python ignores it)", file=sys.stderr)

    def take_exit(self) -> object:
        """The code of an os._exit the backend called since the last look (None: none)."""
        code, self.exit_called = self.exit_called, None
        return code

    def end_children(self) -> None:
        from gptspec.conformance.processes import end_orphans

        end_orphans(self.adoption)

    def _watch(self) -> None:
        from gptspec.conformance.runner import judge_thread

        assert self.timeout is not None
        judge_thread()  # its lines are the judge's, where the backend's output goes aside
        limit = self.timeout + max(GRACE_S, self.timeout / 10)
        while not self.done.wait(1.0):
            waited = time.monotonic() - self.last
            if waited > limit:
                try:
                    self.on_expiry(waited)
                finally:
                    self.end_children()
                    for stream in (sys.stdout, sys.stderr):
                        try:
                            stream.flush()
                        except (OSError, ValueError):
                            pass
                    self.real_exit(1)

    def run_exit_handlers(self, status: int, before_exit: Callable[[], None]) -> None:
        """Where the backend registered exit handlers, run every handler now (the caller
        relays what they print), within the time limit: past it ``before_exit`` runs and
        the process ends with ``status`` without waiting (one asleep kept the finished
        run from exiting, its report written)."""
        if atexit._ncallbacks() <= self.exit_handlers_before:
            return
        runner = threading.Thread(target=atexit._run_exitfuncs, name="gptspec-atexit",
                                  daemon=True)
        runner.start()
        runner.join(self.timeout)
        if runner.is_alive():
            before_exit()
            print(f"gptspec conformance: warning: the backend's exit handlers have not "
                  f"returned within --timeout {self.timeout:g} s; the process ends without "
                  "waiting for them", file=sys.stderr)
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            self.real_exit(status)

    def stray_threads(self) -> list[threading.Thread]:
        """Threads the backend started and left running, which Python waits for at exit."""
        return [t for t in threading.enumerate() if t.is_alive() and not t.daemon
                and t not in self.threads_before and t is not threading.main_thread()]

    def left_running(self) -> bool:
        """Whether a thread the backend started, daemon or not, is still alive."""
        return any(t.is_alive() and t not in self.threads_before and t is not self.watchdog
                   for t in threading.enumerate())
