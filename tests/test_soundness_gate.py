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
    def failing_run(backend, dtype, seed, profile, area, timeout):
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


def _row(backend, dtype, seed, ok=True, code=("src/judge.py",)):
    result = SimpleNamespace(id="softmax.differential", status="pass" if ok else "fail",
                             worst_fraction=0.5 if ok else 1.2, detail="")
    counts = {"pass": int(ok), "fail": int(not ok), "error": 0, "blocked": 0,
              "not-implemented": 0}
    suite = SimpleNamespace(ok=ok, counts=counts, results=[result])
    return gate.Row(backend, dtype, seed, gate.PROFILE_OF.get(backend, "thorough"), suite, 1.0,
                    code)


def test_the_ledger_counts_a_seed_only_when_every_run_passed_on_unchanged_code(
        tmp_path, monkeypatch):
    """Seeds run in several sittings add up, but only while the code each run loaded is
    unchanged, at the full profile and area, with every backend × dtype passed; a failure
    is listed. A change to a file no run loaded counts nothing out."""
    monkeypatch.setattr(gate, "ROOT", tmp_path)
    for name in ("judge.py", "other.py", "cli.py"):
        (tmp_path / "src").mkdir(exist_ok=True)
        (tmp_path / "src" / name).write_text("# one version\n")
    ledger = tmp_path / "ledger.jsonl"
    for seed in (1, 2):
        for backend in gate.BACKENDS:
            for dtype in gate.FULL_DTYPES:
                if (seed, backend, dtype) != (2, "numpy-emulated", "float16"):
                    gate.record(ledger, _row(backend, dtype, seed), "all")
    gate.record(ledger, _row("numpy-emulated", "float16", 2, code=("src/other.py",)), "all")
    gate.record(ledger, _row("numpy-emulated", "float16", 2), "forward")  # a part only
    (tmp_path / "src" / "other.py").write_text("# changed since\n")
    (tmp_path / "src" / "cli.py").write_text("# changed, but no run loaded it\n")
    text, complete, failed = gate.ledger_summary(ledger)
    assert (complete, failed) == (1, 0), text
    assert "24 runs on the code as it is now (1 on code changed since" in text
    assert "seeds that passed every backend × dtype (12 runs each): 1: 1" in text
    assert "2 (11 of 12)" in text
    gate.record(ledger, _row("torch-explicit", "bfloat16", 3, ok=False), "all")
    text, complete, failed = gate.ledger_summary(ledger)
    assert failed == 1 and "FAILED torch-explicit bfloat16 seed 3" in text
    (tmp_path / "src" / "judge.py").write_text("# the judge changed\n")
    text, complete, failed = gate.ledger_summary(ledger)
    assert (complete, failed) == (0, 0) and "0 runs on the code as it is now" in text


def test_a_run_records_the_code_it_loaded_and_its_identity_follows_that_code(
        tmp_path, monkeypatch):
    """The code of a run is what it imported (lazy imports included) under the checkout:
    the judge, the reference, the spec, the backend judged, the soundness variants; not a
    library's module. Its identity changes with any of those files."""
    import gptspec.conformance.budgets  # noqa: F401 — loaded by every run
    import meta.soundness.torch_variants  # noqa: F401

    code = gate.loaded_code()
    for name in ("src/gptspec/conformance/budgets.py", "src/gptspec/reference/attention.py",
                 "src/gptspec/spec/config.py", "meta/soundness/torch_variants.py",
                 "meta/soundness/gate.py"):
        assert name in code, name
    assert not any(name.startswith(("tests/", ".nox")) for name in code)
    assert gate.judge_identity(code) == gate.judge_identity(code)
    copy = tmp_path / "root"
    for name in code:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_bytes((ROOT / name).read_bytes())
    monkeypatch.setattr(gate, "ROOT", copy)
    same = gate.judge_identity(code)
    budgets = copy / "src/gptspec/conformance/budgets.py"
    budgets.write_text(budgets.read_text() + "\n# a change\n")
    assert gate.judge_identity(code) != same
    budgets.unlink()
    assert gate.judge_identity(code) != same  # a file gone counts as changed


def test_the_time_limit_per_check_is_given_to_every_run_and_a_bad_one_refused(monkeypatch, capsys):
    """A sitting on a busy machine lifts the limit (--timeout 0: a thorough check slowed
    past 600 s is an error that leaves its seed unjudged); a negative or non-finite limit
    is refused before anything runs."""
    limits = []

    def passing_run(backend, dtype, seed, profile, area, timeout):
        limits.append(timeout)
        counts = {"pass": 1, "fail": 0, "error": 0, "blocked": 0, "not-implemented": 0}
        suite = SimpleNamespace(ok=True, counts=counts, results=[])
        return gate.Row(backend, dtype, seed, profile, suite, 0.0)  # type: ignore[arg-type]

    monkeypatch.setattr(gate, "run_one", passing_run)
    args = ["--backend", "numpy-emulated", "--dtype", "float32", "--seed", "7"]
    assert gate.main(args) == 0 and gate.main([*args, "--timeout", "0"]) == 0
    assert limits == [600, 0]
    for bad in ("-1", "nan", "inf"):
        try:
            gate.main([*args, "--timeout", bad])
        except SystemExit as stop:
            assert stop.code == 2
        else:
            raise AssertionError(f"--timeout {bad} was accepted")
        assert "--timeout must be a number of seconds" in capsys.readouterr().err
    assert limits == [600, 0]
