"""How long a conformance run takes: ``gptspec conformance`` timed as a subprocess
(the quick profile with --quick, the default profile otherwise), as a user runs it."""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
import time

from benchmarks.report import Report


def command(quick: bool) -> list[str]:
    return [sys.executable, "-m", "gptspec", "conformance", "--profile",
            "quick" if quick else "default"]


def run(report: Report, quick: bool) -> None:
    if importlib.util.find_spec("gptspec.cli.conformance") is None:
        print("[bench] conformance_time: no `gptspec conformance` command; skipped")
        return
    times = []
    for _ in range(1 if quick else 3):
        t0 = time.perf_counter()
        done = subprocess.run(command(quick), capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if done.returncode != 0:  # a failing run is not a timing: say why
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"`{' '.join(command(quick)[1:])}` exited "
                               f"{done.returncode}: {tail[0]}")
    profile = "quick" if quick else "default"
    report.metric("conformance", f"gptspec conformance --profile {profile}",
                  statistics.median(times), "s", "wall time of the whole command")
