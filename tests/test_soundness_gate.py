"""The quick part of the soundness gate (meta/soundness/gate.py --quick): correct backends
written differently from the built-in one pass every check they implement, at the default
profile, seed 0, in float32 and bfloat16. A failure is a false alarm of the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_correct_backends_written_differently_pass_every_check():
    run = subprocess.run([sys.executable, "-m", "meta.soundness.gate", "--quick"], cwd=ROOT,
                         capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    table = run.stdout.split("\n\n")[-2]
    rows = {tuple(line.split()[:2]): line.split() for line in table.splitlines()[1:]}
    for backend in ("torch-explicit", "numpy-emulated"):
        for dtype in ("float32", "bfloat16"):
            row = rows[(backend, dtype)]
            passed, failed = int(row[4]), int(row[5])
            assert passed >= 15 and failed == 0, row  # it ran the checks, not none of them
    assert "4 of 4 runs passed every check" in run.stdout
