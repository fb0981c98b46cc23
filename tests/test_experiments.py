"""``gptspec experiment``: the metric arithmetic, matched compute against the spec's
formulas, the runner's resume after an interruption, bad input, and the Open questions
page with and without results (quick results refused as answers)."""

from __future__ import annotations

import hashlib
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from stop_signals import stop_signals_by_default

from gptspec.cli import main
from gptspec.experiments import metrics, worker
from gptspec.experiments.runner import describe_design, first_difference
from gptspec.experiments.studies import (
    FULL,
    QUICK,
    STUDY_NAMES,
    curve_steps,
    design,
    non_embedding_params,
    width_matching_params,
)
from gptspec.spec import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))

from sitegen import open_questions  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """About 200 kB of real text (this project's spec modules), enough for the quick
    scale's tokenizers and windows."""
    spec = ROOT / "src" / "gptspec" / "spec"
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(spec.glob("*.py")))
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    return path


# --- metrics ---------------------------------------------------------------------------------


class Uniform(torch.nn.Module):
    """A model that knows nothing: equal logits over V tokens, so each predicted token
    costs ln V nats whatever it is."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*x.shape, self.vocab)


def test_bits_per_byte_of_a_model_that_knows_nothing():
    # Byte tokens 0..255 each spell 1 byte; 256..299 spell 3 (their lengths given here).
    # A uniform model over 300 tokens pays ln 300 nats per token, so over the split the
    # bits per byte are log2(300) · (predicted tokens) / (bytes they spell).
    lengths = np.array([1] * 256 + [3] * 44)
    ids = np.array([5, 260, 7, 299, 299, 1, 256, 2, 3, 270, 11])  # 11 tokens, n_ctx 4
    nats, count, n_bytes = worker.split_loss(Uniform(300), ids, worker.window_starts(len(ids), 4),
                                             4, lengths, batch=2)
    targets = ids[1:]  # every token but the first is predicted once
    assert count == len(targets)
    assert n_bytes == 1 * np.sum(targets < 256) + 3 * np.sum(targets >= 256)  # = 18
    expected = len(targets) * math.log2(300) / n_bytes
    # one float32 rounding of ln 300 per token, summed in float64
    assert metrics.bits_per_byte(nats, n_bytes) == pytest.approx(
        expected, rel=len(targets) * np.finfo(np.float32).eps)


def test_bits_per_byte_is_nats_over_bytes_and_ln2():
    assert metrics.bits_per_byte(8 * math.log(2) * 10, 10) == pytest.approx(8, rel=1e-15)
    with pytest.raises(ValueError):
        metrics.bits_per_byte(1.0, 0)


def test_windows_cover_the_split_once():
    for n, T in ((2, 4), (5, 4), (9, 4), (10, 3), (64, 8)):
        covered = [i for s in worker.window_starts(n, T) for i in range(s + 1, min(s + T + 1, n))]
        assert covered == list(range(1, n))


# Student's t for 2 degrees of freedom at 0.975, as printed in tables: 4.303 (three
# decimals, so the table itself is within 0.0005 of the exact value).
T_2 = 4.303


def test_t_interval_against_a_table_value():
    i = metrics.t_interval([1.0, 2.0, 3.0])  # mean 2, sample standard deviation 1
    half = T_2 * 1.0 / math.sqrt(3)
    assert i.mean == 2.0 and i.n == 3
    assert abs(i.half_width - half) <= 0.0005 / math.sqrt(3)
    assert i.low < 2.0 < i.high and i.contains(2.0) and not i.contains(4.6)


def test_paired_difference_and_noise():
    d = metrics.paired_difference([3.0, 5.0, 7.0], [1.0, 3.0, 4.0])  # differences 2, 2, 3
    s = math.sqrt(((2 - 7 / 3) ** 2 * 2 + (3 - 7 / 3) ** 2) / 2)
    assert d.mean == pytest.approx(7 / 3, rel=1e-15)
    assert abs(d.half_width - T_2 * s / math.sqrt(3)) <= 0.0005 * s / math.sqrt(3)
    assert not d.contains(0.0)  # a clear difference
    noisy = metrics.paired_difference([1.0, 2.0, 3.0], [2.0, 1.0, 3.0])  # differences −1, 1, 0
    assert noisy.contains(0.0)
    one = metrics.t_interval([1.5])
    assert math.isnan(one.low) and not one.contains(1.5)  # one seed: no interval at all


# --- the designs against the spec's formulas ----------------------------------------------------


def spec_value(entry: str, config) -> int:
    return int(REGISTRY[entry].sympy(config))


@pytest.mark.parametrize("scale", [FULL, QUICK], ids=["full", "quick"])
@pytest.mark.parametrize("name", ["vocab", "head-width"])
def test_matched_compute_is_the_spec_s_training_flops(scale, name):
    study = design(name, scale)
    base = study.arm(study.baseline)
    per_token = scale.batch_size * scale.n_ctx
    budget = base.steps * per_token * spec_value("training_flops_per_token", base.config)
    for arm in study.arms:
        per_step = per_token * spec_value("training_flops_per_token", arm.config)
        # the nearest whole number of steps to the budget: within half a step of it
        assert abs(arm.steps * per_step - budget) <= per_step / 2, arm.name
    if name == "vocab":  # the same model outside the embedding, whatever the vocabulary
        sizes = {spec_value("param_count_total", a.config)
                 - spec_value("param_count_token_embedding", a.config) for a in study.arms}
        assert len(sizes) == 1
        assert sizes == {non_embedding_params(a.config) for a in study.arms}


@pytest.mark.parametrize("scale", [FULL, QUICK], ids=["full", "quick"])
def test_matched_parameters_are_the_nearest_the_spec_counts_allow(scale):
    study = design("tying", scale)
    tied, untied = study.arm(f"tied-d{scale.d_model}"), study.arm(f"untied-d{scale.d_model}")
    assert spec_value("param_count_total", untied.config) - spec_value(
        "param_count_total", tied.config) == scale.d_model * scale.tying_vocab
    h = scale.n_heads
    for c in study.comparisons[1:]:
        arm, target = study.arm(c.a), study.arm(c.b)
        goal = spec_value("param_count_total", target.config)
        d = arm.config.d_model

        def miss(width: int, config=arm.config, goal=goal) -> int:
            return abs(spec_value("param_count_total", config.replace(d_model=width,
                                                                      d_ff=4 * width)) - goal)

        assert d % h == 0 and miss(d) <= miss(d - h) and miss(d) <= miss(d + h), c
        assert arm.config.tied_embeddings != target.config.tied_embeddings
        assert arm.steps == target.steps
    assert width_matching_params(spec_value("param_count_total", tied.config), tied.config,
                                 tied=True) == scale.d_model


def test_curve_points_are_evenly_spread_and_end_at_the_last_step():
    for steps, points in ((116, 5), (1200, 20), (3, 20), (40, 4), (1, 1)):
        marks = curve_steps(steps, points)
        assert marks[-1] == steps and len(marks) == min(steps, points)
        gaps = np.diff([0, *marks])
        assert gaps.min() >= 1 and gaps.max() - gaps.min() <= 1


def test_head_widths_free_of_d_model_are_in_the_design():
    study = design("head-width", FULL)
    free = [a for a in study.arms if a.config.d_attn != a.config.d_model]
    derived = [a for a in study.arms if a.config.d_attn == a.config.d_model]
    assert len(free) >= 2 and len(derived) >= 3
    assert len({a.config.d_model for a in study.arms}) == 1


# --- bad input -----------------------------------------------------------------------------------


def one_line_error(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0].lower()


def test_bad_names_and_numbers(capsys):
    for argv, needle in ((["experiment", "everything"], "invalid choice"),
                         (["experiment", "vocab", "--jobs", "0"], "--jobs"),
                         (["experiment", "vocab", "--jobs", "two"], "--jobs"),
                         (["experiment", "vocab", "--seeds", "0"], "--seeds"),
                         (["experiment", "vocab", "--seeds", "-3"], "--seeds")):
        with pytest.raises(SystemExit) as stop:  # argparse's errors exit by themselves
            code = main(argv)
            raise SystemExit(code)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and needle in err.lower(), err


def test_bad_data_and_output(tmp_path, capsys, monkeypatch, corpus):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ids.npy").write_bytes(b"\x93NUMPY")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "tiny.txt").write_text("print(1)\n" * 30)
    (tmp_path / "a_file").write_text("x")
    out = ["--out", str(tmp_path / "res")]
    for argv, needle in (
            (["--data", "missing.txt", *out], "does not exist"),
            (["--data", str(tmp_path), *out], "directory"),
            (["--data", "ids.npy", *out], "token ids"),
            (["--data", "latin1.txt", *out], "utf-8"),
            (["--data", "empty.txt", *out], "no text"),
            (["--data", "tiny.txt", *out], "too short"),
            (["--data", str(corpus), "--out", "a_file"], "not a directory"),
            (["--data", str(corpus), "--out", "docs/experiments"], "quick results")):
        line = one_line_error(capsys, ["experiment", "vocab", "--quick", *argv])
        assert needle in line, (argv, line)
    assert not (tmp_path / "res" / ".runs").exists()  # refused before any run


@pytest.mark.parametrize("text", ["", " \n", "a", "print(1)\n" * 30,
                                  # long enough windows, too short for 768 merges
                                  "".join(f"line {i:03d} of a short text\n" for i in range(28))],
                         ids=["empty", "blank", "one-character", "short", "too-few-merges"])
def test_the_plan_refuses_the_data_the_run_refuses_with_its_line(tmp_path, capsys,
                                                                 monkeypatch, text):
    """--plan printed a plan and exited 0 for data the run refuses (hostile round 11)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.txt").write_text(text)
    argv = ["experiment", "vocab", "--quick", "--data", "data.txt", "--out", "res"]
    planned = one_line_error(capsys, [*argv, "--plan"])
    assert "no text" in planned or "too short" in planned, planned
    assert capsys.readouterr().out == ""
    assert one_line_error(capsys, argv) == planned
    assert not (tmp_path / "res" / ".cache").exists()  # refused before a tokenizer was made


def test_the_plan_takes_the_data_the_run_takes(tmp_path, capsys, corpus):
    assert main(["experiment", "vocab", "--quick", "--plan", "--data", str(corpus),
                 "--out", str(tmp_path / "res")]) == 0
    assert "in all:" in capsys.readouterr().out


def test_missing_matplotlib_is_one_line(tmp_path, capsys, monkeypatch, corpus):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    line = one_line_error(capsys, ["experiment", "tying", "--quick", "--data", str(corpus),
                                   "--out", str(tmp_path / "res")])
    assert "matplotlib" in line and "gptspec[experiments]" in line


def test_a_second_study_into_the_same_folder_is_refused_naming_the_first(tmp_path, capsys,
                                                                        corpus):
    """One writer per --out: two studies there wrote the same run files at once, or one
    took the other's live runs for stale ones and advised deleting them (hostile round 7)."""
    import os

    from gptspec.fast.run_lock import LOCK_FILE, RunLock

    out = tmp_path / "res"
    out.mkdir()
    first = RunLock(out)  # what a running study holds
    try:
        line = one_line_error(capsys, ["experiment", "tying", "--quick", "--data",
                                       str(corpus), "--out", str(out)])
    finally:
        first.release(remove=True)
    assert f"pid {os.getpid()}" in line and "wait for it to end" in line, line
    assert sorted(p.name for p in out.iterdir()) == []  # nothing of the second's
    assert not (out / LOCK_FILE).exists()


# --- resume --------------------------------------------------------------------------------------


def _results(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(folder.glob("*.seed*.json")) if not p.name.endswith(".spec.json")}


def test_an_interrupted_study_continues_where_it_stopped(tmp_path, capsys, corpus):
    out = tmp_path / "res"
    argv = ["experiment", "tying", "--quick", "--data", str(corpus), "--out", str(out),
            "--jobs", "1"]
    runs = out / ".runs" / "tying"
    # 1. interrupted (SIGINT, as Ctrl-C) once the first run has finished
    process = subprocess.Popen([sys.executable, "-m", "gptspec", *argv],
                               preexec_fn=stop_signals_by_default,
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not _results(runs) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output
    assert "same command" in output
    kept = _results(runs)
    assert 1 <= len(kept) < 4, output  # the study's four arms were not all done
    assert not list(runs.glob("*.tmp")) and not (out / "tying.json").exists()
    for _, data in kept.values():
        assert json.loads(data)["result"]["bits_per_byte"] > 0  # whole files only

    # 2. the same command finishes the rest and leaves the finished runs alone
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert f"{len(kept)} finished earlier, {4 - len(kept)} to run" in said
    after = _results(runs)
    assert len(after) == 4 and all(after[name] == kept[name] for name in kept)
    study = json.loads((out / "tying.json").read_text())
    assert study["quick"] is True and len(study["runs"]) == 4
    assert {"commit", "modified", "date", "machine", "cpu", "cores", "torch"} <= set(
        study["provenance"]) and study["design"]["seeds"] == [0]
    assert all(set(r["settings"]) >= {"config", "train", "tokenizer", "data"} for r in study["runs"])
    with pytest.raises(open_questions.OpenQuestionsError, match="quick-mode"):
        open_questions.load_results(out, STUDY_NAMES)  # never an answer

    # 3. a deleted result is recomputed, the same number bit for bit (CPU, one thread)
    name = sorted(after)[-1]
    (runs / name).unlink()
    assert main(argv) == 0
    assert "3 finished earlier, 1 to run" in capsys.readouterr().out
    again = _results(runs)
    assert all(again[n] == after[n] for n in after if n != name)
    old, new = (json.loads(x[name][1]) for x in (after, again))
    assert new["result"]["bits_per_byte"] == old["result"]["bits_per_byte"]
    assert new["result"]["curve"] == old["result"]["curve"]

    # 4. a result made with other settings is refused, naming it, before anything runs
    record = json.loads((runs / name).read_text())
    record["settings"]["train"]["lr"] *= 2
    (runs / name).write_text(json.dumps(record))
    line = one_line_error(capsys, argv)
    assert name.lower() in line and "train.lr" in line and "other settings" in line
    assert _results(runs)[name][1] == (runs / name).read_bytes()

    # 5. a result whose numbers no run can produce is run again, with a line naming its
    # file (it gave an unnamed ValueError, or a 300-digit bits per byte); and a token file
    # changed in the cache is made again, not trained on (issue 29): the run is the same,
    # bit for bit
    record["settings"]["train"]["lr"] /= 2
    record["result"]["bits_per_byte"] = "x"
    (runs / name).write_text(json.dumps(record))
    cached = next((out / ".cache").glob("*/*.train.npy"))
    ids = np.load(cached)
    np.save(cached, np.random.default_rng(0).permutation(ids))  # the same ids, shuffled
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert f"{runs / name}: result.bits_per_byte is \"x\", not a number" in said
    assert "3 finished earlier, 1 to run" in said
    assert f"{cached} is not the file the cache made" in said
    assert np.array_equal(np.load(cached), ids)
    assert json.loads((runs / name).read_text())["result"] == old["result"] | {
        "seconds": json.loads((runs / name).read_text())["result"]["seconds"]}


def test_a_damaged_run_record_is_run_again_naming_its_file(tmp_path):
    """Issue 29: a saved run's bits per byte of "x", NaN, null or a list gave a ValueError
    that named no file; −1e308 was accepted and printed with 300 digits. Such a record is
    a cache miss: run again, with one line naming the file and the field."""
    from gptspec.experiments.runner import MAX_BITS_PER_BYTE, PlannedRun, finished, result_problem

    committed = sorted((ROOT / "docs" / "experiments" / ".runs").glob("*/*.seed*.json"))
    committed = [p for p in committed if not p.name.endswith(".spec.json")]
    for path in committed:  # every real result passes
        record = json.loads(path.read_text())
        assert result_problem(record, record["settings"]) is None, path
    source = json.loads(committed[0].read_text()) if committed else None
    if source is None:
        pytest.skip("no committed run results to start from")
    study = design(source["settings"]["study"], FULL)
    arm = next(a for a in study.arms if a.name == source["settings"]["arm"])
    run = PlannedRun(study, arm, source["settings"]["seed"], source["settings"], None,  # type: ignore[arg-type]
                     tmp_path)
    notes: list[str] = []
    run.result_path.write_text(json.dumps(source))
    assert finished(run, notes.append) == source and not notes
    bad = {"x": "not a number", float("nan"): "not a finite number", None: "not a number",
           "[1]": "not a number", -1e308: "outside", 1e308: "outside",
           MAX_BITS_PER_BYTE * 1.01: "outside", 1.0: "nats_per_token"}
    for value, why in bad.items():
        record = json.loads(json.dumps(source))
        record["result"]["bits_per_byte"] = [1] if value == "[1]" else value
        run.result_path.write_text(json.dumps(record))
        notes.clear()
        assert finished(run, notes.append) is None, value
        assert len(notes) == 1 and str(run.result_path) in notes[0], notes
        assert "result.bits_per_byte" in notes[0] and why in notes[0], notes
    for change, field in ((lambda r: r["result"]["curve"].pop(), "result.curve"),
                          (lambda r: r["result"]["curve"][0].__setitem__(1, -1.0), "result.curve"),
                          (lambda r: r["result"].__setitem__("val_tokens", 10**12), "val_tokens"),
                          (lambda r: r["result"]["seconds"].pop("train_wall"), "train_wall"),
                          (lambda r: r["result"].__setitem__("train_flops", True), "train_flops"),
                          (lambda r: r.__setitem__("provenance", []), "provenance"),
                          (lambda r: r.__setitem__("result", 5), "result")):
        record = json.loads(json.dumps(source))
        change(record)
        run.result_path.write_text(json.dumps(record))
        notes.clear()
        assert finished(run, notes.append) is None and field in notes[0], (field, notes)


def test_a_users_files_in_out_are_not_replaced(tmp_path, capsys, corpus):
    """Issue 29: `experiment --out DIR` replaced the user's own DIR/vocab.json and
    DIR/vocab-final.svg, and with `--data DIR/vocab.json` the corpus itself. Each is
    refused in one line naming it, before anything is made."""
    out = tmp_path / "res"
    out.mkdir()
    own = {"vocab.json": '{"my": "own vocab file"}',
           "vocab-final.svg": "<svg>mine</svg>", "vocab-curves.svg": "<svg>mine</svg>"}
    for name, text in own.items():
        (out / name).write_text(text)
        line = one_line_error(capsys, ["experiment", "vocab", "--quick", "--data", str(corpus),
                                       "--out", str(out)])
        assert str(out / name).lower() in line and "move it away" in line, line
        assert (out / name).read_text() == text
        (out / name).unlink()
    # another study's results, and a folder, of the name
    (out / "vocab.json").write_text(json.dumps({"schema": "gptspec-experiment", "study": "tying"}))
    line = one_line_error(capsys, ["experiment", "all", "--quick", "--data", str(corpus),
                                   "--out", str(out)])
    assert "vocab.json holds the results of the study \"tying\"" in line
    (out / "vocab.json").unlink()
    (out / "tying-final.svg").mkdir()
    line = one_line_error(capsys, ["experiment", "all", "--quick", "--data", str(corpus),
                                   "--out", str(out)])
    assert "tying-final.svg is not a regular file" in line
    (out / "tying-final.svg").rmdir()
    # the corpus itself, under the name of a study's output or in its working files
    (out / "vocab.json").write_bytes(corpus.read_bytes())
    line = one_line_error(capsys, ["experiment", "vocab", "--quick", "--data",
                                   str(out / "vocab.json"), "--out", str(out)])
    assert "vocab.json is the --data file" in line
    assert (out / "vocab.json").read_bytes() == corpus.read_bytes()
    (out / "vocab.json").unlink()
    (out / ".cache").mkdir()
    (out / ".cache" / "text.txt").write_bytes(corpus.read_bytes())
    line = one_line_error(capsys, ["experiment", "vocab", "--quick", "--data",
                                   str(out / ".cache" / "text.txt"), "--out", str(out)])
    assert "working files" in line
    assert sorted(p.name for p in out.rglob("*")) == [".cache", "text.txt"]  # nothing made


def test_a_study_replaces_its_own_figures_only(tmp_path, monkeypatch):
    """Its results and figures are refreshed, even after a study was killed between its
    figures and its JSON; a figure the study did not draw is refused, left as it was."""
    from gptspec.experiments import runner
    from gptspec.experiments.summary import summarize

    made = tmp_path / "made"
    made.mkdir()
    data = synthetic(made, "tying")
    data["summary"] = summarize(data["design"]["arms"], data["design"]["comparisons"],
                                data["runs"])
    out = tmp_path / "res"
    runner.write_study(data, out)
    runner.write_study(data, out)  # refreshed in place
    first = (out / "tying-final.svg").read_bytes()

    # killed after its figures, before its JSON: the new figures are still its own
    changed = json.loads(json.dumps(data))
    changed["runs"][0]["result"]["bits_per_byte"] += 0.5
    changed["summary"] = summarize(changed["design"]["arms"], changed["design"]["comparisons"],
                                   changed["runs"])
    real = runner.write_text

    def killed(path, text, **kw):
        if Path(path).name == "tying.json":
            raise KeyboardInterrupt
        real(path, text, **kw)

    monkeypatch.setattr(runner, "write_text", killed)
    with pytest.raises(KeyboardInterrupt):
        runner.write_study(changed, out)
    monkeypatch.setattr(runner, "write_text", real)
    assert (out / "tying-final.svg").read_bytes() != first
    runner.check_outputs(["tying"], out)
    runner.write_study(changed, out)

    (out / "tying-curves.svg").write_text("<svg>mine</svg>")
    with pytest.raises(runner.ExperimentError, match="tying-curves.svg is not a figure"):
        runner.write_study(data, out)
    assert (out / "tying-curves.svg").read_text() == "<svg>mine</svg>"


def test_the_token_cache_is_checked_before_it_is_reused(tmp_path, corpus):
    """Issue 29: a token file changed in OUT/.cache (same length) was trained on, and a
    damaged one failed every run with NumPy's allow_pickle advice, naming no file, at
    every rerun. Each cached file's SHA-256 is recorded and checked: a file that differs
    is made again, and a run's process checks them too."""
    from gptspec.experiments.corpus import split_text, tokenize

    text = split_text(corpus.read_text(encoding="utf-8"), "spec", 0.1)
    cache = tmp_path / "cache"
    made = tokenize(text, 256, cache)
    files = {"tokenizer": made.tokenizer, "train": made.train, "val": made.val}
    original = {name: path.read_bytes() for name, path in files.items()}
    stamps = {name: path.stat().st_mtime_ns for name, path in files.items()}
    notes: list[str] = []
    assert tokenize(text, 256, cache, notes.append) == made and not notes
    assert {name: path.stat().st_mtime_ns for name, path in files.items()} == stamps
    ids = np.load(made.train)
    shuffled = np.random.default_rng(0).permutation(ids)  # the same length and ids
    damage = {"shuffled": lambda p: p.write_bytes(original["train"][:-ids.nbytes]
                                                  + shuffled.tobytes()),
              "junk": lambda p: p.write_bytes(b"junk"),
              "missing": lambda p: p.unlink()}
    for how, do in damage.items():
        for name in ("train", "val", "tokenizer"):
            do(files[name])
            notes.clear()
            assert tokenize(text, 256, cache, notes.append) == made, (how, name)
            assert len(notes) == 1 and str(files[name]) in notes[0], (how, name, notes)
            assert {n: p.read_bytes() for n, p in files.items()} == original
    meta = made.train.with_name("bytes.json")
    record = json.loads(meta.read_text())
    meta.write_text(json.dumps({**record, "sha256": {}}))  # an old record, without them
    notes.clear()
    assert tokenize(text, 256, cache, notes.append) == made and "record" in notes[0]

    # changed after the study's check: the run's process refuses it, naming it
    spec = {"paths": {name: str(path) for name, path in files.items()},
            "sha256": made.sha256}
    worker.check_files(spec)
    np.save(made.val, np.zeros(5, np.uint16))
    with pytest.raises(RuntimeError, match=f"{made.val}.*changed after the study checked it"):
        worker.check_files(spec)


def test_seeds_beyond_the_limit_state_the_limit(capsys):
    """`--seeds 99999999999999999999` said "must be below 2^63"; the limit is 100."""
    for seeds in ("99999999999999999999", "101", "0"):
        line = one_line_error(capsys, ["experiment", "vocab", "--plan", "--seeds", seeds])
        assert "--seeds must be in [1, 100]" in line and "2^63" not in line, line


def test_first_difference_names_the_key():
    assert first_difference({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}}) == "a.c was 2, is now 3"
    assert first_difference({"a": [1, 2]}, {"a": [1, 2]}) is None
    assert first_difference({"a": 1}, {"a": 1, "z": 0}) == "z was null, is now 0"


# --- the page ------------------------------------------------------------------------------------

STUDIES = {name: design(name, FULL) for name in STUDY_NAMES}
VALUES = {"bytes": [2.0, 2.1, 2.2], "bpe-512": [1.90, 1.95, 2.00], "bpe-1024": [1.97, 1.93, 2.01]}


def synthetic(folder: Path, name: str = "vocab", seeds: int = 3, quick: bool = False) -> dict:
    """A results file in ``folder`` for the full design of ``name``, with made-up numbers:
    arm i has bits per byte VALUES[arm] or 2.5 + i/10 + seed/100, and two made-up figures."""
    study = STUDIES[name]
    runs = []
    for i, arm in enumerate(study.arms):
        for seed in range(seeds):
            bpb = VALUES[arm.name][seed] if arm.name in VALUES else 2.5 + i / 10 + seed / 100
            runs.append({"arm": arm.name, "seed": seed, "settings": {}, "provenance": {},
                         "result": {"bits_per_byte": bpb, "val_tokens_per_byte": 1 / (i + 1),
                                    "train_tokens_per_byte": 1 / (i + 1), "train_flops": 1e13,
                                    "train_flops_per_byte": 1e6, "inference_flops_per_byte": 3e5,
                                    "train_bytes_seen": 2e6 * (i + 1), "curve": [[1, bpb]],
                                    "seconds": {"train_wall": 100.0, "process_wall": 110.0}}})
    figures = {}
    for figure in (f"{name}-final.svg", f"{name}-curves.svg"):
        svg = f"<svg xmlns='http://www.w3.org/2000/svg'><title>{figure}</title></svg>".encode()
        (folder / figure).write_bytes(svg)
        figures[figure] = hashlib.sha256(svg).hexdigest()
    data = {"schema": "gptspec-experiment", "version": 1, "study": name, "title": study.title,
            "question": study.question, "quick": quick, "scale": "full",
            "design": describe_design(study, seeds), "runs": runs, "figures": figures,
            "data": {"source": "a made-up corpus", "sha256": "0" * 64, "train_bytes": 9_000_000,
                     "val_bytes": 400_000, "train_chars": 1, "val_chars": 1},
            "provenance": {"commit": "abc", "date": "2026-11-24 10:00 UTC", "machine": "test",
                           "cpu": "test CPU", "cores": 2, "run_commits": ["abc1234567"],
                           "run_process_seconds": 6000.0, "command": {"name": name, "jobs": 2}}}
    (folder / f"{name}.json").write_text(json.dumps(data))
    return data


def test_the_page_without_results_says_so(tmp_path):
    results = open_questions.load_results(tmp_path, STUDY_NAMES)
    assert results == {}
    page = open_questions.page(results, STUDIES)
    assert page.count("No results are committed yet") == 1 + len(STUDY_NAMES)
    assert "**Answer.**" not in page and "bits per byte, mean" not in page
    for study in STUDIES.values():
        assert study.question in page and study.arms[0].label in page  # the design is shown
    for entry_id in {i for ids in open_questions.ENTRIES.values() for i in ids}:
        assert entry_id in REGISTRY
        assert "no results are committed yet" in open_questions.entry_note(
            entry_id, results, STUDIES)


def test_the_page_answers_from_the_numbers(tmp_path):
    synthetic(tmp_path, "vocab")
    results = open_questions.load_results(tmp_path, STUDY_NAMES)
    page = open_questions.page(results, STUDIES)
    assert page.count("No results are committed yet") == 2  # tying and head width
    # the best arm is bpe-512 (mean 1.95; 1.97 for bpe-1024, 2.1 for bytes, the rest
    # above 2.7); its interval is 1.95 ± t(2) · 0.05/√3
    half = T_2 * 0.05 / math.sqrt(3)
    assert "came from BPE 512: 1.950 [" in page
    low = float(page.split("came from BPE 512: 1.950 [")[1].split(",")[0])
    # printed to 3 decimals (0.0005) from a t within 0.0005 of the table's
    assert abs(low - (1.95 - half)) <= 0.0005 + 0.0005 * 0.05 / math.sqrt(3)
    # bpe-1024 − bpe-512 seed by seed: 0.07, −0.02, 0.01, an interval around 0: noise;
    # bytes − bpe-512: 0.1, 0.15, 0.2, an interval above 0: not noise
    answer = page.split("**Answer.**")[1].split("*What")[0]
    assert "BPE 1024 is inside the noise of it" in answer
    assert "bytes (256)" not in answer.split("inside the noise")[0]
    assert "![Vocabulary size: final validation loss](experiments/vocab-final.svg)" in page
    assert "answered by a controlled experiment" in open_questions.entry_note(
        "token_embedding", results, STUDIES)
    for name in ("tying", "head-width"):
        synthetic(tmp_path, name)
    page = open_questions.page(open_questions.load_results(tmp_path, STUDY_NAMES), STUDIES)
    assert page.count("**Answer.**") == 3 and "No results are committed yet" not in page
    assert "embedding holds 39% of the tied model" in page  # 524,288 of 1,334,016


def test_quick_results_and_stale_figures_are_refused(tmp_path):
    synthetic(tmp_path, "tying", quick=True)
    with pytest.raises(open_questions.OpenQuestionsError, match="quick-mode"):
        open_questions.load_results(tmp_path, STUDY_NAMES)
    synthetic(tmp_path, "tying", seeds=2)
    with pytest.raises(open_questions.OpenQuestionsError, match="2 seed"):
        open_questions.load_results(tmp_path, STUDY_NAMES)
    synthetic(tmp_path, "tying")
    (tmp_path / "tying-final.svg").write_text("<svg>another figure</svg>")
    with pytest.raises(open_questions.OpenQuestionsError, match="SHA-256"):
        open_questions.load_results(tmp_path, STUDY_NAMES)


def test_figures_are_reproducible_bytes(tmp_path):
    from gptspec.experiments.plots import figures

    data = synthetic(tmp_path, "head-width")
    from gptspec.experiments.summary import summarize

    data["summary"] = summarize(data["design"]["arms"], data["design"]["comparisons"],
                                data["runs"])
    first, second = figures(data), figures(data)
    assert first == second and set(first) == {"head-width-final.svg", "head-width-curves.svg"}
    assert all(svg.startswith(b"<?xml") for svg in first.values())



def test_log_lines_spell_a_names_escape_sequences_out(tmp_path, capsys, monkeypatch, corpus):
    """The last line named --out as given: its escape sequences drove the terminal."""
    import gptspec.experiments.runner as runner
    from gptspec.cli import main

    def run_studies(studies, corpus, out, jobs, seeds, command, log=print):
        log(f"tying: {out / 'tying.json'} and 2 figures")
        return 0

    monkeypatch.setattr(runner, "run_studies", run_studies)
    out = tmp_path / "res\x1b[2J"
    assert main(["experiment", "tying", "--quick", "--data", str(corpus), "--out",
                 str(out)]) == 0
    printed = capsys.readouterr().out
    assert "\x1b" not in printed and "res\\x1b[2J/tying.json and 2 figures" in printed


def test_the_plan_prints_its_flops_in_a_unit_that_shows_them(capsys):
    """A quick plan's total was printed as "0.0 TFLOP of training"."""
    assert main(["experiment", "all", "--quick", "--plan"]) == 0
    out = capsys.readouterr().out
    total = out.strip().splitlines()[-1]
    assert total.startswith("in all: ") and " 0.0 " not in total and "FLOP" in total
    number, unit = total.split()[2:4]
    assert 1 <= float(number) < 1000 and unit in ("MFLOP", "GFLOP", "TFLOP", "PFLOP")


def test_a_pipe_is_text_data_as_for_train(tmp_path, capsys, corpus):
    """`experiment --data <(command)` was refused as not a regular file (train takes it)."""
    import os
    import threading

    read, write = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(write, corpus.read_bytes()),
                                              os.close(write)))
    writer.start()
    try:
        assert main(["experiment", "vocab", "--quick", "--jobs", "1", "--data",
                     f"/dev/fd/{read}", "--out", str(tmp_path / "x")]) == 0, \
            capsys.readouterr().err
        assert json.loads((tmp_path / "x" / "vocab.json").read_text())
    finally:
        writer.join()
        os.close(read)


DEEP_JSON = "[" * 200_000 + "]" * 200_000  # deeper than Python's JSON parser follows


def test_json_nested_too_deeply_is_named_or_made_again(tmp_path, corpus):
    """Hostile round, finding 10: deeply nested JSON in the token cache's record, a run
    record, the study's JSON or its figures record gave "RecursionError: maximum recursion
    depth exceeded", naming no file. The cache's record is made again (as an unreadable
    one is); the others are refused in one line naming the file."""
    from gptspec.experiments.corpus import split_text, tokenize
    from gptspec.experiments.runner import (
        ExperimentError,
        PlannedRun,
        check_outputs,
        finished,
    )

    text = split_text(corpus.read_text(encoding="utf-8"), "spec", 0.1)
    cache = tmp_path / "cache"
    made = tokenize(text, 256, cache)
    record = made.train.with_name("bytes.json")
    record.write_text(DEEP_JSON)
    notes: list[str] = []
    assert tokenize(text, 256, cache, notes.append) == made
    assert len(notes) == 1 and "record" in notes[0] and "making it again" in notes[0], notes
    assert json.loads(record.read_text())["vocab"] == 256

    study = design("vocab", QUICK)
    run = PlannedRun(study, study.arms[0], 0, {}, made, tmp_path / "runs")
    run.folder.mkdir()
    run.result_path.write_text(DEEP_JSON)
    with pytest.raises(ExperimentError, match="nested too deeply") as refused:
        finished(run)
    assert str(run.result_path) in str(refused.value) and "\n" not in str(refused.value)

    out = tmp_path / "out"
    (out / ".runs" / "vocab").mkdir(parents=True)
    (out / ".runs" / "vocab" / "figures.json").write_text(DEEP_JSON)
    check_outputs(["vocab"], out)  # no figure there: the record is rewritten by the study
    (out / "vocab-final.svg").write_text("<svg/>")
    with pytest.raises(ExperimentError, match="vocab-final.svg is not a figure the vocab"):
        check_outputs(["vocab"], out)
    (out / "vocab-final.svg").unlink()
    (out / "vocab.json").write_text(DEEP_JSON)
    with pytest.raises(ExperimentError, match="nested too deeply") as refused:
        check_outputs(["vocab"], out)
    assert str(out / "vocab.json") in str(refused.value) and "\n" not in str(refused.value)


def _running_study(argv: list[str], runs: Path) -> subprocess.Popen:
    """``gptspec`` with ``argv`` in a process of its own, once its first run has started
    (its spec written), its stop signals' defaults restored (stop_signals)."""
    process = subprocess.Popen([sys.executable, "-m", "gptspec", *argv],
                               preexec_fn=stop_signals_by_default,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(runs.glob("*.spec.json")) and process.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, process.communicate()
    return process


@pytest.mark.parametrize("signum, status, said", [
    (signal.SIGTERM, 143, "terminated"), (signal.SIGHUP, 129, "hung up (SIGHUP)")])
def test_sigterm_and_sighup_stop_a_study_as_they_stop_train(tmp_path, corpus, signum, status,
                                                            said):
    """Hostile round, finding 13: SIGTERM and SIGHUP were reported as a Ctrl-C
    ("interrupted: …" on standard output, exit 130); train exits 143 and 129. Now the
    same statuses, the line on standard error, and the runs stopped."""
    out = tmp_path / "res"
    process = _running_study(["experiment", "tying", "--quick", "--data", str(corpus),
                              "--out", str(out), "--jobs", "1"], out / ".runs" / "tying")
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == status, (stdout, stderr)
    assert stderr.strip().splitlines()[-1].startswith(
        f"gptspec experiment: {said}: the finished runs are kept in "), stderr
    assert "interrupted" not in stdout and "Traceback" not in stderr


def test_a_link_or_fifo_in_place_of_a_runs_log_is_refused_naming_it(tmp_path, capsys, corpus):
    """Hostile round, finding 4: a link at OUT/.runs/<study>/<run>.log was opened through,
    emptying the file it pointed to, and the study reported success. A run's working file
    that is a link or not a regular file is refused in one line naming it, before
    anything runs (as train refuses a loss.png link); the log itself is opened without
    following a link, so one put there later is refused too."""
    import os

    from gptspec.experiments import runner

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "res"
    runs = out / ".runs" / "tying"
    runs.mkdir(parents=True)
    arm = design("tying", QUICK).arms[0].name
    for suffix in (".log", ".spec.json", ".json"):
        link = runs / f"{arm}.seed0{suffix}"
        link.symlink_to(victim)
        line = one_line_error(capsys, ["experiment", "tying", "--quick", "--jobs", "1",
                                       "--data", str(corpus), "--out", str(out)])
        assert str(link).lower() in line and "symbolic link" in line, line
        assert victim.read_text() == "precious\n"
        link.unlink()
    assert not list(runs.glob("*.seed*"))  # nothing ran

    log = runs / "opened.log"
    log.symlink_to(victim)
    with pytest.raises(runner.ExperimentError, match=f"{log} is a symbolic link"):
        runner._open_log(log)
    log.unlink()
    os.mkfifo(log)  # no reader: not waited on
    with pytest.raises(runner.ExperimentError, match=f"{log} is not a regular file"):
        runner._open_log(log)
    log.unlink()
    log.write_text("an earlier run's log\n")
    with runner._open_log(log) as opened:
        opened.write("this run's\n")
    assert log.read_text() == "this run's\n" and victim.read_text() == "precious\n"


def test_a_full_disk_while_the_token_cache_is_written_is_one_line_naming_the_file(
        tmp_path, capsys, monkeypatch, corpus):
    """Hostile round, finding 12: on a full disk the command said only "error: OSError:
    371822 requested and 106432 written" (NumPy's short write, with no errno). The line
    names the file and says the disk is full; no temporary file is left."""
    import errno

    from gptspec.experiments import corpus as corpus_module

    def short_write(f, ids, allow_pickle=False):
        f.write(b"\x93NUMPY")
        raise OSError(f"{ids.nbytes} requested and 6 written")

    out = tmp_path / "res"
    argv = ["experiment", "vocab", "--quick", "--jobs", "1", "--data", str(corpus),
            "--out", str(out)]

    def error_line() -> str:  # as for any failure during the work (exit 1), in one line
        assert main(argv) == 1
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        return lines[0]

    monkeypatch.setattr(corpus_module.np, "save", short_write)
    line = error_line()
    assert line.startswith("gptspec experiment: error: cannot write the token cache, the "
                           "disk is full (a short write: "), line
    assert line.endswith(".train.npy") and str(out / ".cache") in line, line
    assert not [p for p in (out / ".cache").rglob("*") if p.name.endswith(".tmp")]

    def no_space(f, ids, allow_pickle=False):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(corpus_module.np, "save", no_space)
    line = error_line()
    assert "cannot write the token cache, the disk is full (No space left on device): " \
        in line, line
    assert line.endswith("bytes.train.npy"), line


def _workers_of(spec: Path) -> list[int]:
    """The pids of the live processes running the worker on ``spec`` (read from /proc)."""
    import os

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if os.fsencode(str(spec)) in argv and b"gptspec.experiments.worker" in argv \
                and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_dies_with_its_killed_study(tmp_path, corpus):
    """Hostile round, finding 6: SIGKILL of `gptspec experiment` left its worker running
    (adopted by init), finishing its run; a rerun took over the lock and started the same
    run beside it. The worker now dies with the study (PR_SET_PDEATHSIG), its run left
    undone."""
    import os

    out = tmp_path / "res"
    runs = out / ".runs" / "tying"
    process = _running_study(["experiment", "tying", "--quick", "--data", str(corpus),
                              "--out", str(out), "--jobs", "1"], runs)
    spec = next(runs.glob("*.spec.json"))
    deadline = time.monotonic() + 60
    while not (workers := _workers_of(spec)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert workers, "the study's worker did not start"
    process.kill()
    process.communicate(timeout=30)
    deadline = time.monotonic() + 120
    while _workers_of(spec) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _workers_of(spec)
    for pid in left:  # this test's own orphan, by the pid found above
        os.kill(pid, signal.SIGKILL)
    assert not left, "the worker outlived its study"
    result = spec.with_name(spec.name.removesuffix(".spec.json") + ".json")
    assert not result.exists(), "the orphan finished its run"


def test_a_worker_whose_parent_died_before_it_asked_exits_at_once():
    """The race in finding 6's fix: a parent that died before the worker's prctl ran is
    seen in getppid, and the worker exits instead of running on."""
    code = "from gptspec.parent_death import die_with_parent\n" \
           "import os\ndie_with_parent(os.getppid())\nprint('alive')\n" \
           "die_with_parent(os.getppid() + 1)\nprint('still alive')\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and done.stdout == "alive\n", done
