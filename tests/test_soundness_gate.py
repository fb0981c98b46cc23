"""The quick part of the soundness gate (meta/soundness/gate.py --quick): correct backends
written differently from the built-in one pass every check they implement, at the default
profile, in float32 and bfloat16, at a seed drawn afresh each run (printed, with the
command that reproduces a failure). A failure is a false alarm of the suite."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from meta.soundness import gate

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
    assert re.search(r"^seeds \d+ \(drawn at random\)", run.stdout, re.M), run.stdout[:500]


def test_seeds_are_drawn_afresh_unless_given():
    drawn = [gate.choose_seeds(None, 3, None) for _ in range(2)]
    assert all(len(set(d)) == 3 and all(0 <= s < gate.SEED_RANGE for s in d) for d in drawn)
    assert drawn[0] != drawn[1]  # equal with probability 2⁻⁹³
    assert gate.choose_seeds([7, 11, 7], 3, None) == [7, 11]
    assert gate.choose_seeds(None, 3, 4) == [4, 5, 6]


def test_a_failing_run_fails_the_gate_and_prints_its_reproduction(monkeypatch, capsys):
    """The gate can still fail: a run with a failed check exits 1 and names the seed that
    reproduces it (the real runs are replaced by a canned failure)."""
    def failing_run(backend, dtype, seed, profile, area):
        result = SimpleNamespace(id="gpt_backward.long_batch", status="fail",
                                 worst_fraction=1.15, detail="115% of budget")
        counts = {"pass": 0, "fail": 1, "error": 0, "blocked": 0, "not-implemented": 0}
        suite = SimpleNamespace(ok=False, counts=counts, results=[result])
        return gate.Row(backend, dtype, seed, profile, suite, 0.0)  # type: ignore[arg-type]

    monkeypatch.setattr(gate, "run_one", failing_run)
    assert gate.main(["--backend", "numpy-emulated", "--dtype", "bfloat16", "--seed", "7"]) == 1
    out = capsys.readouterr().out
    assert "seeds 7 (as given)" in out
    assert ("reproduce: python -m meta.soundness.gate --backend numpy-emulated --dtype bfloat16 "
            "--profile thorough --area all --seed 7") in out
    assert "0 of 1 runs passed every check" in out
