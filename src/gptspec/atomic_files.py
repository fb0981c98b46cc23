"""Writing a file so that a reader (or a crash) never sees half of it.

The content goes to a temporary file beside the target, is flushed to disk, and is then
renamed over the target; the folder is flushed too, so the rename itself survives a
power cut. On any error the temporary file is removed and the target is left as it was.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

RANDOM_CHARACTERS = 8  # what tempfile puts between the prefix and the suffix


def temporary_prefix(target: Path, suffix: str = ".tmp") -> str:
    """``.NAME.`` for a temporary file beside ``target``, the name cut short (at a UTF-8
    character's start) where the whole temporary name would pass the folder's limit on a
    name's bytes: any name the file system takes as a target works."""
    name = os.fsencode(target.name)
    try:
        limit = os.pathconf(target.parent if target.parent.is_dir() else ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    room = max(limit - 2 - RANDOM_CHARACTERS - len(os.fsencode(suffix)), 1)
    if len(name) > room:
        name = name[:room]
        while name and name[-1] & 0xC0 == 0x80:  # a continuation byte: back to the start
            name = name[:-1]
        name = name[:-1] if name and name[-1] >= 0xC0 else name
    return f".{os.fsdecode(name)}."


def fsync_folder(folder: Path) -> None:
    """Flush a folder's entries (a rename in it) to disk."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def created_mode(directory: bool = False) -> int:
    """The permissions a plain ``open(name, "w")`` (``mkdir``) gives a new file: 0o666
    (0o777) less the umask, not a temporary name's private 0o600 (0o700)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def kept_mode(target: Path) -> int:
    """The permissions for a file written over ``target``: an existing regular file's own
    (as ``open(target, "w")`` keeps them), else those of a new file."""
    try:
        found = target.stat()
    except (OSError, ValueError):
        return created_mode()
    return stat.S_IMODE(found.st_mode) if stat.S_ISREG(found.st_mode) else created_mode()


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], *, make_parents: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write; when the block ends without an
    error it is flushed and renamed onto ``path``, else removed. The file gets the usual
    permissions (the umask's, or those of the file it replaces), not the temporary name's
    private ones. A symbolic link is written through, as ``open(path, "w")`` would: the
    file it points to is replaced, the link stays."""
    target = Path(path)
    descriptor = _own_descriptor(target)
    if descriptor is not None:  # /dev/stdout … : where the shell sent it, at its offset
        yield from _streaming(target, descriptor)
        return
    if is_stream(target):  # through any link
        yield from _streaming(target)
        return
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    folder = target.parent
    if make_parents:
        folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=temporary_prefix(target), suffix=".tmp", dir=folder)
    os.close(fd)
    tmp = Path(name)
    try:
        mode = kept_mode(target)
        os.chmod(tmp, mode)
        yield tmp
        os.chmod(tmp, mode)  # a writer may have put a file of its own in the name's place
        with open(tmp, "rb") as written:
            os.fsync(written.fileno())
        os.replace(tmp, target)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.filename is None or os.fspath(err.filename) != os.fspath(tmp):
            raise
        # the temporary name is gone and means nothing to the user: name the target
        raise OSError(err.errno, err.strerror, os.fspath(target)) from err
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(folder)


def is_stream(path: Path) -> bool:
    """A character device or a pipe (/dev/null, a FIFO), or this process's own descriptor
    (/dev/stdout, whatever it goes to): written in place, there is nothing to replace."""
    if _own_descriptor(path) is not None:
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _own_descriptor(path: Path) -> int | None:
    """N where ``path`` names this process's descriptor N (/dev/stdout, /dev/stderr,
    /dev/fd/N, /proc/self/fd/N): opened again, a file behind it (``>> log``) would be
    opened anew and replaced or written from its start, not appended to."""
    named = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
    text = os.path.normpath(str(path))
    if text in named:
        return named[text]
    for prefix in ("/dev/fd/", "/proc/self/fd/", f"/proc/{os.getpid()}/fd/"):
        if text.startswith(prefix) and text[len(prefix):].isdigit():
            return int(text[len(prefix):])
    return None


def _streaming(target: Path, descriptor: int | None = None) -> Iterator[Path]:
    """``replacing`` for a stream: the writer writes a private temporary file, whose bytes
    then go to ``target`` (a pipe opened without waiting: one nobody reads is an error),
    or to this process's ``descriptor`` itself."""
    fd, name = tempfile.mkstemp(prefix=".gptspec-stream-", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        data = tmp.read_bytes()
        if descriptor is not None:
            out = descriptor
        else:
            try:
                out = os.open(target, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as err:
                if err.errno == errno.ENXIO:  # a FIFO with no reader
                    raise OSError(err.errno, "no process reads from it") from None
                raise
            os.set_blocking(out, True)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
        finally:
            if descriptor is None:
                os.close(out)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(path: str | os.PathLike[str], data: bytes, *, make_parents: bool = False) -> None:
    with replacing(path, make_parents=make_parents) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike[str], text: str, *, make_parents: bool = False) -> None:
    with replacing(path, make_parents=make_parents) as tmp:
        tmp.write_text(text, encoding="utf-8")
