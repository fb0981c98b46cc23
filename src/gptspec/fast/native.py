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
from collections.abc import Iterator
from pathlib import Path


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
