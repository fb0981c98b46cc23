"""The ``gptspec`` command: one subcommand per module of this package.

Each subcommand module defines ``add_arguments(parser)`` and ``run(args) -> int``;
they are imported only when chosen, so ``gptspec info`` does not pay for torch.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import io
import os
import re
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import TextIO

SUBCOMMANDS = {
    "conformance": "validate a backend against the float64 reference",
    "tokenizer": "train, encode and decode with a byte-level BPE tokenizer",
    "train": "train a model",
    "generate": "generate text from a checkpoint",
    "info": "sizes and costs of a preset",
    "convert": "convert checkpoints to and from the transformers layout",
    "experiment": "answer the Notes' open questions with controlled studies",
}


class CLIError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def printable(text: object) -> str:
    """``text`` on one line that a terminal shows as written: line breaks, escape
    sequences and other invisible characters (from a file name, a prompt or a backend's
    message) are spelled as Python escapes (``\\n``, ``\\x1b``)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def error_line(command: str, err: CLIError | str) -> str:
    """The one line a CLIError is reported as."""
    return f"gptspec {command}: error: {printable(err)}"


def standard_stream(name: str, why: str) -> TextIO:
    """sys.stdin or sys.stdout, which Python sets to None when the caller closed it
    (``<&-``, ``>&-``): a command that needs it says so in one line."""
    stream = getattr(sys, name)
    if stream is None:
        words = {"stdin": "standard input", "stdout": "standard output"}[name]
        raise CLIError(f"{words} is closed; {why}")
    return stream


@contextlib.contextmanager
def writing_stdout() -> Iterator[None]:
    """A block that writes the command's output: standard output refusing it (a full
    disk) is one line naming it. A reader that went away (BrokenPipeError) is left to
    main, which stops quietly."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as err:
        if err.errno is None:  # no write's: a library that cannot be loaded (ulimit -v)
            raise
        if err.errno in (errno.EMFILE, errno.ENFILE):  # an open's, never a write's
            import resource

            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            raise CLIError(f"{err.strerror}: this process may have {limit} files open at "
                           "once (ulimit -n); raise the limit") from None
        raise CLIError(f"cannot write to standard output: {err.strerror or err}") from None


def _too_many_digits(message: str) -> str:
    """argparse's "invalid int value: '999…'" for a whole number of more digits than
    Python converts (4300) said a valid number was not one, and echoed every digit."""
    found = re.fullmatch(r"(argument \S+: )invalid int value: '\s*[+-]?([\d_]+)\s*'", message)
    if not found:
        return message
    digits = len(found[2].replace("_", ""))
    return f"{found[1]}a number of {digits} digits (no number gptspec reads has so many)"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is reported in one line (the usage is one --help away)."""

    def error(self, message: str):  # type: ignore[override]
        message = _too_many_digits(message)
        first = printable(message.strip()) if message.strip() else "bad arguments"
        self.exit(2, f"{self.prog}: error: {first} (see {self.prog} --help)\n")


def build_parser(which: str | None = None) -> argparse.ArgumentParser:
    parser = OneLineParser(prog="gptspec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == which:  # only the chosen subcommand's module is imported
            importlib.import_module(f"gptspec.cli.{name}").add_arguments(p)
    return parser


# threads a backend run in this process left running (conformance --no-isolate, stopped by
# an error or a signal): Python waits for them at exit, forever if they never end
ABANDONED_THREADS: list[threading.Thread] = []


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; its exit status. Called without ``argv`` (the ``gptspec``
    command itself) it also looks after the process: closed standard streams, an
    encoding that cannot spell the output, and Ctrl-C before the subcommand starts or
    while Python shuts down."""
    status = _main(argv)
    if argv is None and any(t.is_alive() for t in ABANDONED_THREADS):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()
        os._exit(status)
    return status


def _main(argv: list[str] | None) -> int:
    command = argv is None
    argv = sys.argv[1:] if argv is None else argv
    which = next((a for a in argv if a in SUBCOMMANDS), None)
    try:
        if command:
            _guard_standard_streams()
            signal.signal(signal.SIGTERM, _terminate)
            if getattr(signal, "SIGHUP", None) and signal.getsignal(signal.SIGHUP) == signal.SIG_DFL:
                signal.signal(signal.SIGHUP, _hang_up)  # (one ignored, as under nohup, stays so)
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                signal.signal(signal.SIGINT, _interrupt)  # (one inherited as ignored stays so)
            sys.unraisablehook = _stop_again
            warnings.showwarning = _warning_line(f"gptspec{f' {which}' if which else ''}")
        return _run(argv, which)
    except KeyboardInterrupt as stop:  # while the subcommand's modules were being imported
        return _interrupted(f"gptspec{f' {which}' if which else ''}", stop)
    except Exception as err:
        behind = _stop_behind(err)
        if behind is None:
            raise
        return _interrupted(f"gptspec{f' {which}' if which else ''}", behind)
    finally:
        if command:  # a Ctrl-C now would only interrupt Python's exit with a traceback:
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # it ends the process, silently
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if getattr(signal, "SIGHUP", None) and signal.getsignal(signal.SIGHUP) is _hang_up:
                signal.signal(signal.SIGHUP, signal.SIG_DFL)
            sys.unraisablehook = sys.__unraisablehook__
            warnings.showwarning = _python_showwarning


_python_showwarning = warnings.showwarning


def _warning_line(who: str):
    """gptspec's own warnings as one line, as its errors are (Python's form quotes the
    source line that raised it); other libraries' keep Python's form."""
    show = _python_showwarning
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

    def showwarning(message, category, filename, lineno, file=None, line=None) -> None:
        if not os.path.abspath(filename).startswith(package):
            return show(message, category, filename, lineno, file, line)
        text = str(message).removeprefix("gptspec: ")
        print(f"{who}: warning: {printable(text)}", file=file or sys.stderr)

    return showwarning


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``docker stop``, a batch system), raised like Ctrl-C so that the
    command's cleanup runs: temporary files go, a conformance worker is stopped, the
    report of the finished checks is written."""


# The stop signals this process received, in order: a C extension interrupted while it
# loads may swallow the KeyboardInterrupt and report an ImportError of its own with no
# trace of it (NumPy: "PyCapsule_Import could not import module "datetime""), and the
# error is then reported as the stop it was.
_RECEIVED: list[int] = []


class HungUp(Terminated):
    """SIGHUP (the terminal or SSH session closed), raised as SIGTERM is: the command's
    cleanup runs (a half-made output or a lock file goes)."""


def _terminate(signum: int, frame: object) -> None:
    _RECEIVED.append(signum)
    raise Terminated()


def _hang_up(signum: int, frame: object) -> None:
    _RECEIVED.append(signum)
    raise HungUp()


def _interrupt(signum: int, frame: object) -> None:
    _RECEIVED.append(signum)
    raise KeyboardInterrupt()


def _stop_again(unraisable: sys.UnraisableHookArgs) -> None:
    """A Ctrl-C or SIGTERM whose handler ran inside a garbage-collector callback or a
    __del__ (Hypothesis keeps one on every collection) raised where Python ignores
    exceptions: it printed a traceback and the command went on, to its end. The signal is
    sent again a moment later, from a thread, once the main thread has left the place
    that swallowed it (sent at once, its handler would run inside this hook, and be
    swallowed again); should it land in such a place again, this repeats."""
    stop = unraisable.exc_value
    if isinstance(stop, KeyboardInterrupt):
        # which signal: training's Interrupted carries it; Terminated is SIGTERM
        signum = getattr(stop, "signum", signal.SIGHUP if isinstance(stop, HungUp) else
                         signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)
        again = threading.Timer(0.01, os.kill, (os.getpid(), signum))
        again.daemon = True
        again.start()
        return
    sys.__unraisablehook__(unraisable)


def _interrupted(who: str, stop: KeyboardInterrupt) -> int:
    """The line and exit status of a command stopped by Ctrl-C (130) or SIGTERM (143)."""
    if isinstance(stop, HungUp):
        print(f"{who}: hung up (SIGHUP)", file=sys.stderr)
        return 128 + signal.SIGHUP
    terminated = isinstance(stop, Terminated)
    print(f"{who}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
    return 128 + (signal.SIGTERM if terminated else signal.SIGINT)


def _guard_standard_streams() -> None:
    """A standard stream closed by the caller (``>&-``) leaves its descriptor free, and
    the next file opened would get it: a C library's message to "stderr" would then land
    in a checkpoint. /dev/null holds the place (Python's sys.stdout stays None, so a
    command that must write there can say so). And an output encoding such as ASCII
    (PYTHONIOENCODING) gets escapes for what it cannot spell, not a crash."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            placeholder = os.open(os.devnull, os.O_RDWR)
            if placeholder != fd:
                os.dup2(placeholder, fd)
                os.close(placeholder)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    # closed (2>&-), descriptor 2 is /dev/null now: print(file=None) would write into
    # standard output
    sys.stderr = _best_effort(sys.stderr) if sys.stderr is not None else _diagnostics(2)


class _DiagnosticsSink(io.RawIOBase):
    """Descriptor 2, written to as far as it takes it: a standard error that refuses
    (``2>/dev/full``, a dead disk, a reader gone) drops the diagnostics, never the
    command's work nor its output; the exit status still tells an error."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        try:
            return os.isatty(self._fd)
        except OSError:
            return False

    def write(self, data) -> int:  # type: ignore[override]
        try:
            return os.write(self._fd, data)
        except OSError:
            return len(memoryview(data))


def _best_effort(stream: TextIO) -> TextIO:
    """``stream`` (sys.stderr), with writes that cannot be made dropped instead of raised:
    a warning, a progress bar or the error line itself failed the command
    (``gptspec train … 2>/dev/full`` lost the checkpoint). Installed before anything (tqdm)
    keeps a reference to sys.stderr."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return stream  # not a file (a test's capture): left as it is
    return _diagnostics(fd, stream.encoding)


def _diagnostics(fd: int, encoding: str = "utf-8") -> TextIO:
    """A text stream onto descriptor ``fd`` that drops what the descriptor refuses."""
    return io.TextIOWrapper(io.BufferedWriter(_DiagnosticsSink(fd)), encoding=encoding,
                            errors="backslashreplace", line_buffering=True, write_through=True)


def _run(argv: list[str], which: str | None) -> int:
    args = build_parser(which).parse_args(argv)
    module = importlib.import_module(f"gptspec.cli.{args.command}")
    try:
        status = int(module.run(args) or 0)
        if sys.stdout is not None:
            with writing_stdout():  # here, not at exit, where a full disk goes unreported
                sys.stdout.flush()
        return status
    except CLIError as err:
        print(error_line(args.command, err), file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        return _interrupted(f"gptspec {args.command}", stop)
    except BrokenPipeError:
        # the reader went away (``gptspec generate … | head -c 2``): stop quietly, and keep
        # Python from complaining again when it flushes stdout at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by it
    except (OSError, MemoryError, RecursionError, Exception) as err:
        # failures that only show up during the work (disk full, permission lost, out of
        # memory): one line, and with GPTSPEC_TRACEBACK=1 the traceback for a bug report
        behind = _stop_behind(err)
        if behind is not None:
            return _interrupted(f"gptspec {args.command}", behind)
        if os.environ.get("GPTSPEC_TRACEBACK"):
            raise
        if isinstance(err, ModuleNotFoundError) and (err.name or "").partition(".")[0] == "torch":
            # torch is an extra: the conformance suite runs without it, training and
            # generation do not
            print(error_line(args.command, CLIError(
                "this needs PyTorch, which is not installed: pip install 'gptspec[torch]'")),
                file=sys.stderr)
            return 2
        unmapped = _unmapped_library(err)
        if unmapped:
            print(error_line(args.command, CLIError(unmapped)), file=sys.stderr)
            return 2
        print(error_line(args.command, _describe(err)), file=sys.stderr)
        return 1


def _unmapped_library(err: BaseException) -> str:
    """The line for a shared library the loader could not map (torch's, OpenMP's) under
    an address-space limit (``ulimit -v``): said as that, not as an unexpected
    ImportError; "" for any other error."""
    text = str(err)
    if not isinstance(err, (ImportError, OSError)) or "failed to map segment" not in text:
        return ""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    said = ("unlimited" if limit == resource.RLIM_INFINITY
            else f"{limit / 2**20:.0f} MiB")
    return (f"cannot load {printable(text.split(':')[0])}: the loader could not map it into "
            f"memory; this process's address-space limit (ulimit -v) is {said}")


def _stop_behind(err: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C, SIGTERM or SIGHUP that caused ``err``, if one did: a C extension interrupted
    while it loads reports an ImportError of its own (NumPy's begins "IMPORTANT: PLEASE
    READ THIS"), whose context is the KeyboardInterrupt, or, where the extension swallowed
    it, which follows a stop signal this process received (_RECEIVED)."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    if _RECEIVED:
        stop = {signal.SIGTERM: Terminated, getattr(signal, "SIGHUP", -1): HungUp}
        return stop.get(_RECEIVED[-1], KeyboardInterrupt)()
    return None


def _describe(err: BaseException) -> str:
    """One line for an unexpected failure: the OS's words and file for an OSError."""
    if isinstance(err, MemoryError):
        return "out of memory"
    if isinstance(err, OSError) and err.strerror:
        where = f": {err.filename}" if err.filename else ""
        return f"{err.strerror}{where}"
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''} (GPTSPEC_TRACEBACK=1 shows where)"
