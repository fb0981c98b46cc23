"""A child process that ends with its parent (Linux): even a parent killed by SIGKILL,
which runs no cleanup, takes its workers with it, so a rerun never finds an orphan still
computing, and writing, the same run beside its own."""

from __future__ import annotations

import os
import signal

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent ends, then exit at once if
    ``parent`` (the pid that started it) is no longer its parent: the parent died before
    the request took effect and this process was adopted. Where prctl is missing (not
    Linux) only that check is made."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)
