"""Up-front checks of command-line values: each failure is a :class:`CLIError` whose one
line names the flag (or file) and the problem, raised before any work is done, so a bad
value never costs a training run or leaves half a file behind.

Paths are checked for what the command will do with them (read a file, write a file,
make or fill a folder); numbers for being finite and in range; seeds for fitting the
generators (0 ≤ seed < 2^63); devices for existing on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gptspec.atomic_files import is_stream
from gptspec.cli import CLIError, printable
from gptspec.fast.run_lock import missing_folders, remove_empty

MAX_SEED = 2**63  # torch.manual_seed and NumPy take any integer in [0, 2^63)
MAX_COUNT = 2**63  # counts (steps, batches, tokens) are kept as 64-bit integers


def _name_too_long(path: Path) -> str | None:
    """Why the file system would refuse this name, or None (checked without creating it)."""
    try:
        name_max = os.pathconf(_nearest_existing(path), "PC_NAME_MAX")
        path_max = os.pathconf(_nearest_existing(path), "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    if any(len(os.fsencode(part)) > name_max for part in path.parts):
        return f"a name in it is longer than {name_max} bytes"
    if len(os.fsencode(str(path.absolute()))) >= path_max:
        return f"it is longer than {path_max} bytes"
    return None


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _writable_folder(folder: Path, flag: str, what: str) -> None:
    """Try it: permission bits say nothing for root, a read-only mount or an immutable
    folder, and a file made and removed at once leaves the folder as it was."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix=".gptspec-write-test.", dir=folder)
    except OSError as err:
        # the OS's words are about the file made, not the folder: procfs answers ENOENT
        # in a folder that exists ("No such file or directory (/proc/self)" was false)
        raise CLIError(f"{flag}: cannot write {what}: creating a file in {folder} failed: "
                       f"{err.strerror}") from None
    os.close(fd)
    os.unlink(name)


def path_argument(text: str) -> Path:
    """argparse's type for a path: an empty one is refused (``Path("")`` would quietly
    be the current folder)."""
    if not text:
        raise argparse.ArgumentTypeError("the path is empty")
    return Path(text)


STANDARD_STREAM = "-"  # the usual spelling of standard input or output


def file_argument(text: str) -> Path:
    """argparse's type for a file: as :func:`path_argument`, and a name ending in ``/``
    (a folder's spelling, which ``Path`` would silently drop) is refused, as is ``-``
    where a standard stream is not taken (it would name a file called "-")."""
    if text == STANDARD_STREAM:
        raise argparse.ArgumentTypeError("'-' (a standard stream) is not taken here; give a "
                                         "file name (./- for a file named '-')")
    if text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"{text!r} ends in '/', which names a folder, not a "
                                         "file")
    return path_argument(text)


def stream_argument(text: str) -> Path | None:
    """argparse's type for a file or a standard stream: ``-`` is None (standard input or
    output), anything else as :func:`file_argument`."""
    return None if text == STANDARD_STREAM else file_argument(text)


def path_name(path: str | os.PathLike[str], flag: str) -> None:
    """A path's spelling alone, for a command that looks at the path in several ways
    (a checkpoint folder or a killed save's copy beside it), and the first check of every
    other path check here: not empty (``Path("")`` is the current folder), no NUL, names
    the file system accepts, not a broken link."""
    if not str(path):  # before Path(), which reads "" as "."
        raise CLIError(f"{flag}: the path is empty")
    path = Path(path)
    if "\0" in str(path):
        raise CLIError(f"{flag}: the path contains a NUL byte")
    why = _name_too_long(path)
    if why:
        raise CLIError(f"{flag}: {str(path)[:60]}… cannot be a path: {why}")
    if path.is_symlink() and not path.exists():
        raise CLIError(f"{flag}: {path} is a symbolic link to nothing (broken or a loop)")


def input_file(path: str | os.PathLike[str], flag: str, *, pipe: bool = False) -> Path:
    """A regular file this process can read (or, with ``pipe``, a pipe: text read once
    from start to end, as ``--input <(command)`` gives it; see :func:`read_input`)."""
    path_name(path, flag)
    p = Path(path)
    if not p.exists():
        raise CLIError(f"{flag}: {p} does not exist")
    if p.is_dir():
        raise CLIError(f"{flag}: {p} is a directory, not a file")
    if pipe and p.is_fifo():
        return p
    if not p.is_file():
        kind = "a regular file or a pipe" if pipe else "a regular file"
        raise CLIError(f"{flag}: {p} is not {kind}")
    try:
        with open(p, "rb"):
            pass
    except OSError as err:
        raise CLIError(f"{flag}: cannot read {p}: {err.strerror}") from None
    return p


def read_input(path: Path | None, flag: str, stdin: Any = None) -> bytes:
    """Every byte of ``path`` (a regular file or a pipe; ``stdin``'s binary buffer where
    ``path`` is None), refused past half the memory this process may use (``<(yes)``
    never ends). A named pipe is opened without waiting for a writer; one that has no
    writer (or whose writer closed it empty) is an error, not an empty input."""
    limit = memory_limit()
    cap = limit[0] // 2 if limit is not None else None
    where = "standard input" if path is None else str(path)
    parts: list[bytes] = []
    try:
        if path is None:
            def read() -> bytes:
                return stdin.read(1 << 20)
        else:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                first = os.read(fd, 1 << 20)
            except BlockingIOError:  # a writer that has not written yet: wait for it
                first = None
            if first == b"" and path.is_fifo():
                os.close(fd)
                raise CLIError(f"{flag}: the pipe {path} gave nothing: no process was "
                               "writing to it, or the writer closed it empty")
            os.set_blocking(fd, True)
            parts = [first] if first else []

            def read() -> bytes:
                return os.read(fd, 1 << 20)
        try:
            size = sum(map(len, parts))
            while chunk := read():
                parts.append(chunk)
                size += len(chunk)
                if cap is not None and limit is not None and size > cap:
                    raise CLIError(f"{flag}: {where} gives more than {cap / 2**30:.1f} GiB, "
                                   f"half of {limit[1]} {limit[0] / 2**30:.1f} GiB of memory")
        finally:
            if path is not None:
                os.close(fd)
    except OSError as err:  # a file that opens but cannot be read (/proc/self/mem, EIO)
        raise CLIError(f"{flag}: cannot read {where}: {err.strerror or err}") from None
    return b"".join(parts)


def input_dir(path: str | os.PathLike[str], flag: str) -> Path:
    """A folder this process can list and read."""
    path_name(path, flag)
    p = Path(path)
    if not p.exists():
        raise CLIError(f"{flag}: {p} does not exist")
    if not p.is_dir():
        raise CLIError(f"{flag}: {p} is not a directory")
    if not os.access(p, os.R_OK | os.X_OK):
        raise CLIError(f"{flag}: cannot read the folder {p}: permission denied")
    return p


def not_in_a_run_checkpoint(path: Path, flag: str) -> None:
    """Refuse an output inside a training run's checkpoint folder (``RUN/checkpoint``,
    its link targets included): the run replaces that folder at each save and deletes the
    copy before, so whatever was written there was lost two saves later, silently — a
    whole nested run included."""
    from gptspec.fast.run_lock import LOCK_FILE

    real = Path(os.path.realpath(path))
    if real.name in ("tokens.bin", "loss.png") and (real.parent / LOCK_FILE).exists():
        raise CLIError(f"{flag}: {printable(path)} is a training run's {real.name}, which "
                       f"the run writes and its resume reads; choose another {flag}")
    for folder in (real, *real.parents):
        # a run's: its folder has the run's lock, or it holds a run's state (a resume
        # there would replace it as well)
        if (folder.name == "checkpoint" or folder.name.startswith(".checkpoint.")) and (
                (folder.parent / LOCK_FILE).exists() or (folder / "state.json").is_file()):
            where = "is" if folder == real else f"is inside {printable(folder)},"
            # only the lock file says so: name it, for a folder that no run uses (a writer
            # killed by SIGKILL leaves its lock file)
            lock = "" if (folder / "state.json").is_file() else (
                f" (its lock file {printable(folder.parent / LOCK_FILE)} says so: if no run "
                "uses that folder, remove the file)")
            raise CLIError(f"{flag}: {printable(path)} {where} a training run's checkpoint "
                           f"folder, which the run replaces at each save; choose another "
                           f"{flag}{lock}")


def output_file(path: str | os.PathLike[str], flag: str) -> Path:
    """A file that can be (re)placed: its folder exists and is writable, it is not a
    directory, nor inside a training run's checkpoint folder. (Files are written under a
    temporary name and renamed, so a read-only file in a writable folder is replaced, as
    ``mv`` would.)"""
    path_name(path, flag)
    if str(path) == STANDARD_STREAM:
        raise CLIError(f"{flag} -: standard output is not taken here; give a file name "
                       "(./- for a file named '-')")
    p = Path(path)
    not_in_a_run_checkpoint(p, flag)
    if str(path).endswith(os.sep) or p.is_dir():
        raise CLIError(f"{flag}: {p} is a directory; give a file name")
    if is_stream(p):  # /dev/null, /dev/stdout, a FIFO: written in place
        return p
    if p.exists() and not p.is_file():
        raise CLIError(f"{flag}: {p} exists and is neither a regular file, a device nor a pipe")
    folder = p.absolute().parent
    if not folder.exists():
        raise CLIError(f"{flag}: folder {folder} does not exist")
    if not folder.is_dir():
        raise CLIError(f"{flag}: {folder} is not a folder")
    _writable_folder(folder, flag, str(p))
    return p


def training_run_lock(target: Path, flag: str, create: Path | None = None,
                      check: Callable[[], None] | None = None) -> Any:
    """The lock of the training run whose folder holds ``target`` (a file or folder to be
    written: the run's folder, its checkpoint or something inside it), to hold while
    writing; a no-op context elsewhere. Without it a conversion or a tokenizer written into
    RUN/checkpoint was reported written, then replaced by the run's next save (issue 29).

    ``create``: the folder whose lock to take when no lock file is there yet (made, with
    the folders above it, if need be): RUN for a conversion into RUN/checkpoint, which a
    fresh ``train --out RUN`` would otherwise claim and replace, or the output folder
    itself, which a second conversion would fill. Each writer then refuses the other,
    naming its pid. The lock file and folders made for it go afterwards (unless filled).
    ``check``: the command's checks of its paths, run once a lock file found is held (a
    live writer's is refused naming it, not taken for a run's), and before any folder is
    made for one."""
    from gptspec.fast.run_lock import LOCK_FILE

    def found() -> Path | None:
        for run in (target, target.parent, target.parent.parent):
            if (run / LOCK_FILE).exists() or (run / LOCK_FILE).is_symlink():
                return run
        return None

    for _ in range(100):
        run = found()
        if run is None and check is not None:
            check()
            check = None
            run = found()  # made while the paths were checked
        folder = run if run is not None else create
        if folder is None:
            return contextlib.nullcontext()
        made = missing_folders(folder)  # the deepest first
        lock = take_run_lock(folder, target, flag, named=folder == create, made=made)
        if run is not None and lock.created:  # the file found was removed by its holder
            lock.release(remove=True)  # as it let go: look again
            remove_empty(made)
            continue
        try:
            if not lock.created:  # a run's lock file, maybe one made since the checks
                if check is not None:
                    check()
                not_in_a_run_checkpoint(target, flag)
        except BaseException:
            lock.release()
            remove_empty(made)
            raise
        return _holding(lock, folder, made)
    raise CLIError(f"{flag} {printable(target)}: the lock file in it keeps being made and "
                   "removed by other processes; try again")


def take_run_lock(folder: Path, target: Path, flag: str, named: bool, made: list[Path]) -> Any:
    """``folder``'s RunLock (the folder made if need be), each refusal in one line.
    ``named``: the folder is the one the command writes (or a run's folder to be), not a
    run's folder found above the target."""
    from gptspec.fast.run_lock import RunLock, RunLocked

    try:
        folder.mkdir(parents=True, exist_ok=True)
        return RunLock(folder)
    except RunLocked as err:
        remove_empty(made)
        holder = str(err).split("; ")[0]
        if named:
            raise CLIError(f"{flag} {printable(target)}: {holder}; wait for it to end or "
                           f"choose another {flag}") from None
        raise CLIError(f"{flag} {printable(target)} is in a training run's folder: "
                       f"{holder}; choose another {flag}") from None
    except OSError as err:
        remove_empty(made)
        raise CLIError(f"{flag} {printable(target)}: cannot take the lock of "
                       f"{printable(folder)}: {err.strerror or err}") from None


@contextlib.contextmanager
def _holding(lock: Any, folder: Path, made: list[Path]) -> Iterator[Any]:
    """Hold ``lock`` while the block writes; then let go. A lock file this process made
    goes (a run's checkpoint there would need it: none can be, the lock kept runs out),
    and so do the folders made for it that nothing filled."""
    from gptspec.fast.checkpoint import find_checkpoints

    try:
        yield lock
    finally:
        lock.release(remove=lock.created and not find_checkpoints(folder / "checkpoint"))
        remove_empty(made)


def same_file(a: Path, b: Path) -> bool:
    """Whether two existing paths name one file (links and other spellings included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # either does not exist (yet)
        return False


def not_an_input(output: Path, flag: str, inputs: dict[str, Path | None]) -> None:
    """Refuse an output that is one of the command's own inputs (the same file under any
    name): the atomic replace would put the result where the input was."""
    for input_flag, path in inputs.items():
        if path is not None and same_file(output, path):
            raise CLIError(f"{flag} {output} is the {input_flag} file; writing it would "
                           f"replace that input")


def output_dir(path: str | os.PathLike[str], flag: str) -> Path:
    """A folder that exists and is writable, or can be made (its nearest existing
    ancestor is a writable folder), and is not inside a training run's checkpoint folder."""
    path_name(path, flag)
    if str(path) == STANDARD_STREAM:
        raise CLIError(f"{flag} -: a folder is written here, not a standard stream; give a "
                       "folder name (./- for a folder named '-')")
    p = Path(path)
    not_in_a_run_checkpoint(p, flag)
    if p.exists():
        if not p.is_dir():
            raise CLIError(f"{flag}: {p} exists and is not a directory")
        _writable_folder(p, flag, f"into {p}")
        return p
    ancestor = _nearest_existing(p)
    if not ancestor.is_dir():
        raise CLIError(f"{flag}: cannot make {p}: {ancestor} is a file, not a folder")
    _writable_folder(ancestor, flag, f"the folder {p}")
    return p


def beyond_floats(value: float) -> str:
    """Why a number written in digits reads as inf: "got inf" alone said it was typed so."""
    return " (a number past ±1.8e308 reads as inf)" if math.isinf(value) else ""


def finite(value: float, flag: str, *, low: float | None = None, high: float | None = None,
           low_open: bool = False, high_open: bool = False) -> float:
    """A finite number in [low, high] (either end open if asked)."""
    if not math.isfinite(value):
        raise CLIError(f"{flag} must be a finite number, got {value}{beyond_floats(value)}")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        lo = "" if low is None else f"{'(' if low_open else '['}{low:g}"
        hi = "" if high is None else f"{high:g}{')' if high_open else ']'}"
        where = (f"in {lo}, {hi}" if low is not None and high is not None
                 else f"{'>' if low_open else '≥'} {low:g}" if low is not None
                 else f"{'<' if high_open else '≤'} {high:g}")
        raise CLIError(f"{flag} must be {where}, got {value:g}")
    return value


def integer(value: int, flag: str, *, low: int | None = None, high: int | None = None) -> int:
    """An integer in [low, high] that a 64-bit integer holds (state.json and torch keep
    counts so; a larger one is a typo, not a request)."""
    if not -MAX_COUNT <= value < MAX_COUNT:
        raise CLIError(f"{flag} must be below 2^63 (a 64-bit integer), got {value}")
    if low is not None and value < low:
        raise CLIError(f"{flag} must be ≥ {low}, got {value}")
    if high is not None and value > high:
        raise CLIError(f"{flag} must be ≤ {high}, got {value}")
    return value


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def jobs(value: int, flag: str = "--jobs") -> int:
    """A number of one-thread processes to run at once: 1 up to the cores this process may
    use (more only slows every one of them, and each holds a model in memory)."""
    integer(value, flag, low=1)
    if value > cores():
        raise CLIError(f"{flag} {value} is more than the {cores()} core(s) this process may "
                       "use; each job takes one core, so more at once only slows them all")
    return value


def seed(value: int | None, flag: str = "--seed") -> int | None:
    if value is not None and not 0 <= value < MAX_SEED:
        raise CLIError(f"{flag} must lie in [0, 2^63), got {value}")
    return value


def device_name(name: str, flag: str = "--device") -> str:
    """A device name a backend could declare and a reproduce line can repeat: not empty,
    no whitespace, no control character (what a backend calls its devices is its own)."""
    if not name.strip():
        raise CLIError(f"{flag}: the device name is empty (cpu, cuda, cuda:1, …)")
    if any(c.isspace() or not c.isprintable() for c in name):
        raise CLIError(f"{flag}: the device name {name!r} holds whitespace or a control "
                       "character")
    return name


def device(name: str, flag: str = "--device") -> str:
    """A torch device that exists here: cpu, or cuda[:i] with that GPU present."""
    import torch

    try:
        parsed = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise CLIError(f"{flag}: {name!r} is not a device (cpu, cuda, cuda:1, …)") from None
    if parsed.type == "cpu":
        if parsed.index not in (None, 0):  # PyTorch takes any index there and ignores it
            raise CLIError(f"{flag} {name}: the CPU is one device (cpu, or cpu:0)")
        return name
    if parsed.type != "cuda":
        raise CLIError(f"{flag}: device type {parsed.type!r} is not supported (cpu or cuda)")
    if not torch.cuda.is_available():
        raise CLIError(f"{flag} {name}: CUDA is not available on this machine")
    if parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise CLIError(f"{flag} {name}: this machine has {torch.cuda.device_count()} GPU(s)")
    return name


def memory_bytes() -> int | None:
    """Physical memory plus swap this process could hope to use, or None if unknown."""
    limit = memory_limit()
    return None if limit is None else limit[0]


def memory_limit() -> tuple[int, str] | None:
    """(bytes, what limits them): the machine's physical memory, or less where the
    process's address space is limited (``ulimit -v``, RLIMIT_AS): then what is left of
    that limit, since the mappings already made (Python, the libraries) count against it."""
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        pages = 0
    best = (int(pages), "this machine's") if pages > 0 else None
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        infinite = resource.RLIM_INFINITY
    except (ImportError, OSError, ValueError):
        return best
    if soft == infinite or soft <= 0:
        return best
    left = max(soft - _address_space_used(), 0)
    if best is None or left < best[0]:
        best = (left, f"the {soft / 2**30:.1f} GiB address-space limit's (ulimit -v) remaining")
    return best


def _address_space_used() -> int:
    """This process's mapped address space (what RLIMIT_AS counts), 0 where unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def fits_in_memory(n_bytes: int, what: str) -> None:
    """Refuse an allocation larger than the memory this process may use before trying it."""
    limit = memory_limit()
    if limit is not None and n_bytes > limit[0]:
        total, whose = limit
        raise CLIError(f"{what} needs {n_bytes / 2**30:.1f} GiB, more than {whose} "
                       f"{total / 2**30:.1f} GiB of memory")
