"""What the judge does at the operating system's level (Linux; elsewhere, nothing) about
the processes a backend runs in or starts: the worker's output into a file, the worker
without the judge's resource tracker or CAP_SYS_PTRACE, the judge undumpable, and every
process a backend left behind ended with the run (the judge their subreaper meanwhile)."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import sys
import time
from typing import Any


def print_into(path: str) -> None:
    """Point this process's standard output and error (Python's and C code's alike, and
    those of any child forked later) at the file ``path``, which the judge relays. Nothing
    the backend starts then holds the judge's own pipes."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)


def let_go_of_the_judges_tracker() -> None:
    """Close this worker's end of the judge's multiprocessing resource tracker: the tracker
    (a process of the judge's, writing to the judge's output) lives until every end is
    closed, so an end that a backend's escaped grandchild inherits would keep it, and the
    caller's pipes, open. A backend that needs a tracker gets its own."""
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker, "_resource_tracker", None)
    fd = getattr(tracker, "_fd", None)
    if tracker is not None and fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
        tracker._fd = None
        tracker._pid = None


def process_table() -> dict[int, tuple[int, str]]:
    """Linux: every process /proc shows, pid → (parent's pid, state); {} where it cannot
    be read."""
    table: dict[int, tuple[int, str]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                state, parent = stat.read().rsplit(")", 1)[1].split()[:2]
            table[int(name)] = (int(parent), state)
        except (OSError, ValueError, IndexError):
            continue
    return table


def children() -> set[int]:
    """Linux: the pids of this process's children (none where /proc cannot be read)."""
    me = os.getpid()
    return {pid for pid, (parent, _) in process_table().items() if parent == me}


@dataclasses.dataclass(frozen=True)
class Adoption:
    """The judge as the subreaper of its descendants for one run: the children it had
    before, and whether it was a subreaper already (its caller's setting, put back)."""

    children_before: frozenset[int]
    was_subreaper: bool


def _subreaper(libc: Any) -> bool | None:
    flag = ctypes.c_int(0)
    if libc.prctl(37, ctypes.byref(flag), 0, 0, 0) != 0:  # PR_GET_CHILD_SUBREAPER
        return None
    return bool(flag.value)


def adopt_orphans() -> Adoption | None:
    """Linux: make the judge the subreaper of its descendants, so that a process a backend
    left behind in a session of its own becomes the judge's child (not init's) and can be
    ended with the run (end_orphans). None: not possible here."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        was = _subreaper(libc)
        if was is None or libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
            return None
    except (OSError, AttributeError):
        return None
    return Adoption(frozenset(children()), was)


ORPHANS_SECONDS = 10.0  # the most end_orphans spends on what a backend left running


def end_orphans(adoption: Adoption | None) -> None:
    """Kill (and reap) every descendant the judge has gained during the run: what a backend
    started and left, which would otherwise outlive the run (and, say, rewrite its report).
    The whole tree at once, stopped before it is killed, so that a chain of processes each
    forking the next cannot stay a step ahead; the children the judge had before are left
    alone. Then the judge is a subreaper again only if it was one before the run."""
    if adoption is None:
        return
    try:
        _end_strays(adoption.children_before)
    finally:
        if not adoption.was_subreaper:  # a library caller's orphans go to init again
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL(None, use_errno=True).prctl(36, 0, 0, 0, 0)


def _end_strays(before: frozenset[int]) -> None:
    from multiprocessing import resource_tracker

    me = os.getpid()
    keep = before | {getattr(resource_tracker._resource_tracker, "_pid", None) or -1}
    deadline = time.monotonic() + ORPHANS_SECONDS
    while time.monotonic() < deadline:
        table = process_table()
        below: dict[int, list[int]] = {}
        for pid, (parent, _) in table.items():
            below.setdefault(parent, []).append(pid)
        stray, todo = set(), [p for p in below.get(me, []) if p not in keep]
        while todo:
            pid = todo.pop()
            if pid not in stray:
                stray.add(pid)
                todo.extend(below.get(pid, []))
        if not stray:
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):  # stopped, none forks any more
            for pid in stray:
                if table[pid][1] != "Z":
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
        for pid in stray:  # the dead become the judge's (its subreaper): reaped
            try:
                os.waitpid(pid, os.WNOHANG)
            except OSError:
                pass
        time.sleep(0.01)


def undumpable() -> int | None:
    """Linux: make this process (the judge) undumpable, so that processes of the same
    user cannot open its memory or descriptors through /proc or attach to it (with the
    worker's CAP_SYS_PTRACE gone, root's either); the setting before (None: not here)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        before = libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
        if before < 0 or libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
            return None
        return int(before)
    except (OSError, AttributeError):
        return None


def dumpable_again(before: int | None) -> None:
    if before:
        ctypes.CDLL(None, use_errno=True).prctl(4, before, 0, 0, 0)


def without_ptrace() -> None:
    """Linux: this process (the backend's worker) gives up CAP_SYS_PTRACE for good, in its
    effective, permitted and inheritable sets and, where it may, its bounding set: run as
    root, it could otherwise still read and write the undumpable judge's memory."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(24, 19, 0, 0, 0)  # PR_CAPBSET_DROP CAP_SYS_PTRACE (needs CAP_SETPCAP)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, self
        data = (ctypes.c_uint32 * 6)()  # {effective, permitted, inheritable} × 2 words
        if libc.capget(header, data) != 0:
            return
        for word in range(3):  # CAP_SYS_PTRACE is bit 19 of the first word
            data[word] &= ~(1 << 19) & 0xFFFFFFFF
        libc.capset(header, data)
    except (OSError, AttributeError):
        pass


