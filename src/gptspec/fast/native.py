"""Building gptspec's two C++ kernels (``bf16_gemv``, ``cpu_gelu``) on first use.

``torch.utils.cpp_extension`` compiles a kernel once and caches it (in
``~/.cache/torch_extensions``, keyed by the source), so later processes only load it.
The helpers here are what both kernels check before a build.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

BUILD_WAIT_S = 600.0  # past this another process's build is taken for hung


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags as /proc/cpuinfo lists them (None where it cannot be read:
    a kernel then builds and its own check decides)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), None)
    return None if line is None else set(line.partition(":")[2].split())


def put_ninja_on_path() -> None:
    """PyTorch runs ``ninja`` from PATH; the ninja wheel (a dependency) may sit in an
    environment whose scripts folder is not on it."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


@contextlib.contextmanager
def streams_for_the_build() -> Iterator[None]:
    """cpp_extension writes to and flushes sys.stdout and sys.stderr, which Python sets to
    None when the caller closed them (``>&-``): a closed stream must not change which
    kernel runs, so the build gets /dev/null in their place."""
    saved = sys.stdout, sys.stderr
    with open(os.devnull, "w") as null:
        sys.stdout = sys.stdout or null
        sys.stderr = sys.stderr or null
        try:
            yield
        finally:
            sys.stdout, sys.stderr = saved


@contextlib.contextmanager
def exclusive_build(name: str, wait_s: float = BUILD_WAIT_S) -> Iterator[None]:
    """One build or load of kernel ``name`` at a time, under a lock that its holder's
    death releases (``fcntl.flock``). PyTorch's own build lock is a file made with O_EXCL,
    which a process killed while building leaves behind, and every later load then waited
    on it forever (hostile round 7). Under this lock nobody else is building, so such a
    file is stale and goes. A build still held after ``wait_s``: TimeoutError (the caller
    warns and uses PyTorch's product)."""
    import fcntl  # (Linux only, as the kernels are)

    from torch.utils.cpp_extension import _get_build_directory

    folder = Path(_get_build_directory(name, verbose=False))
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / "gptspec.lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0),
                 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process has held its build for over "
                                       f"{wait_s:.0f} s") from None
                time.sleep(0.1)
        with contextlib.suppress(FileNotFoundError):
            (folder / "lock").unlink()  # PyTorch's, left by a builder that died
        yield
    finally:
        os.close(fd)  # (the flock goes with it)
