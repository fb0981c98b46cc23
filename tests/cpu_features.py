"""The CPU's feature flags, read from /proc/cpuinfo by the tests themselves: independent
of the helpers the kernels use (gptspec.fast.native), so a test that compares a kernel's
availability with these flags does not take the code under test's word for them."""

from __future__ import annotations

from pathlib import Path


def cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()
