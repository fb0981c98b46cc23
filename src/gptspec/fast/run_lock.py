"""One writer per training run directory.

``RunLock(out)`` takes an exclusive ``fcntl.flock`` on ``OUT/.train.lock`` and writes its
pid there; a second ``gptspec train`` on the same OUT is refused (:class:`RunLocked`,
naming the holder's pid) instead of saving over the first one's checkpoint. The kernel
drops the lock when its holder dies however it dies, so a killed run's lock is simply
taken by the next run, which writes its own pid over the dead one. A run refused before
it wrote anything removes the lock file it made. Cleaning up what a killed run left
(temporary files) is safe only while holding the lock.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from pathlib import Path

LOCK_FILE = ".train.lock"


class RunLocked(RuntimeError):
    """Another live process holds the run directory's lock."""


class RunLock:
    def __init__(self, out: str | os.PathLike[str]) -> None:
        self.path = Path(out) / LOCK_FILE
        self.created = False  # whether this process made the lock file
        for _ in range(100):
            self.fd = self._open()
            self._lock(out)
            if self._still_named():
                break
            # the holder before us removed the file as it let go (release(remove=True)):
            # our lock is on a name nobody else will lock again; take the new one
            os.close(self.fd)
        else:
            raise OSError(errno.EAGAIN, f"{self.path} keeps being removed; try again")
        # the holder's pid, for the refusal above: written whole with one write after
        # truncating, so a reader sees the old pid, nothing, or this one
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    def _open(self) -> int:
        # never through a link: the pid written below would overwrite the link's target
        flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
        self.created = False  # of this attempt's file
        try:
            while True:  # made here, or there: removed between the two opens, try again
                try:
                    fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644)
                    self.created = True
                    break
                except FileExistsError:
                    with contextlib.suppress(FileNotFoundError):
                        fd = os.open(self.path, flags | os.O_NONBLOCK)
                        break
        except OSError as err:
            if self.path.is_symlink():
                raise OSError(err.errno, f"{self.path} is a symbolic link, which a run's "
                                         "lock file never is; remove it") from None
            if self.path.is_dir():
                raise OSError(err.errno, f"{self.path} is a directory, which a run's lock "
                                         "file never is; remove it") from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device: no pid there
            os.close(fd)
            raise OSError(errno.EINVAL, f"{self.path} is not a regular file, which a run's "
                                        "lock file always is; remove it")
        return fd

    def _lock(self, out: str | os.PathLike[str]) -> None:
        import fcntl

        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder, text = _holder(self.fd)
            os.close(self.fd)
            if holder is not None:
                # train or convert (into RUN/checkpoint) holds it: not always a train
                raise RunLocked(f"{out} is being written by another gptspec command (pid "
                                f"{holder}); wait for it to end or choose another --out"
                                ) from None
            # the flock is the authority: some live process holds it, but the file's
            # contents (written by whoever) do not say which
            said = f"holds {text!r}, not a pid" if text else "is empty"
            raise RunLocked(f"{out} is locked: a live process holds the lock on {self.path}, "
                            f"which {said}; wait for that process to end or choose another "
                            "--out") from None
        except OSError:
            os.close(self.fd)
            raise

    def _still_named(self) -> bool:
        """Whether the locked file is still the one at self.path."""
        try:
            named = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        held = os.fstat(self.fd)
        return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)

    def release(self, remove: bool = False) -> None:
        """Let the run go. ``remove``: delete the lock file too (a run that wrote nothing);
        safe because a process that locks the removed file sees it no longer named and
        takes the lock again."""
        if self.fd >= 0:
            if remove and self._still_named():
                self.path.unlink(missing_ok=True)
            os.close(self.fd)  # closing drops the flock
            self.fd = -1

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _holder(fd: int) -> tuple[int | None, str]:
    """(the pid the holder wrote, or None; the file's first bytes as read). A gptspec
    holder may be a moment away from writing its pid: asked again for 0.2 s."""
    text = ""
    for _ in range(20):
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isascii() and text.isdigit() and len(text) < 20:
            return int(text), text
        time.sleep(0.01)
    return None, text[:20]


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and the folders above it that do not exist, the deepest first."""
    missing = []
    for above in (folder, *folder.parents):
        if os.path.lexists(above):
            break
        missing.append(above)
    return missing


def remove_empty(folders: list[Path]) -> None:
    for folder in folders:  # the deepest first; one that was filled stays, and those above
        try:
            folder.rmdir()
        except OSError:
            break


def remove_stale_temporaries(out: Path, names: tuple[str, ...]) -> list[Path]:
    """Delete the temporary files (``.NAME.XXXXXXXX.tmp``, see atomic_files) a killed run
    left beside ``OUT/NAME``. Only for the lock's holder: another writer's are live."""
    from gptspec.atomic_files import temporary_prefix

    removed = []
    prefixes = tuple(temporary_prefix(out / name) for name in names)
    for entry in os.scandir(out):
        if entry.name.startswith(prefixes) and entry.name.endswith(".tmp") and entry.is_file(
                follow_symlinks=False):
            Path(entry.path).unlink(missing_ok=True)
            removed.append(Path(entry.path))
    return removed
