"""Running studies: prepare the tokenizations, plan every run, run the missing ones as
independent processes, and write each study's results and figures.

OUT/<study>.json (schema ``gptspec-experiment``) and OUT/<study>-*.svg are the results;
OUT/.runs/<study>/ (one ``<arm>.seed<k>.json`` per finished run) and OUT/.cache/ are
working state. A run whose file has these settings is not run again; other settings are
refused, naming the file; a result no run can produce (``result_problem``) is run again.
Files are written whole and renamed. A study replaces only its own files: a JSON of that
study, figures whose SHA-256 it recorded (also in .runs/<study>/figures.json); a run's
working file (log, spec, result) that is a link or not a regular file is refused.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptspec.atomic_files import write_bytes, write_text
from gptspec.experiments.corpus import (
    Corpus,
    Tokenized,
    corpus_problem,
    file_sha256,
    tokenize,
)
from gptspec.experiments.plots import figure_names
from gptspec.experiments.studies import Arm, Study, curve_steps, training_settings
from gptspec.experiments.summary import summarize
from gptspec.reference.costs import param_count_total, training_flops_per_token
from gptspec.spec.config import parse_json

HARNESS_VERSION = 1  # bump when a run would compute something else from the same settings
STUDY_SCHEMA = "gptspec-experiment"
RUN_SCHEMA = "gptspec-experiment-run"
FIGURES_SCHEMA = "gptspec-experiment-figures"

# The largest bits per byte a run can record. The worker computes each predicted token's
# cross-entropy in float32 and fails a run whose loss is not finite, so a token costs at
# most float32's largest value in nats; every token spells at least one byte (no special
# tokens), so predicted tokens ≤ bytes, and bits per byte = Σ nats / (bytes · ln 2) ≤
# FLOAT32_MAX / ln 2 ≈ 4.9e38. A tighter bound (8, or log2 V per token, a uniform model's)
# would not be a bound: a diverged model does worse than uniform (a run on shuffled tokens
# recorded 8.0013), and a legitimate result refused here would be run again at every
# invocation, to the same number. Below 0 is impossible (cross-entropy is ≥ 0).
FLOAT32_MAX = 3.4028234663852886e38
MAX_BITS_PER_BYTE = FLOAT32_MAX / math.log(2)


class ExperimentError(Exception):
    """A study that cannot go on (conflicting earlier results, a corpus too short); the
    message is one line naming the problem."""


class Stopped(KeyboardInterrupt):
    """SIGTERM while runs ran, outside the gptspec command (which raises its own); its
    ``signum`` says which signal, for the exit status 128 + signum."""

    def __init__(self, signum: int) -> None:
        super().__init__()
        self.signum = signum


@dataclass(frozen=True)
class PlannedRun:
    study: Study
    arm: Arm
    seed: int
    settings: dict
    tokens: Tokenized
    folder: Path  # OUT/.runs/<study>

    @property
    def stem(self) -> str:
        return f"{self.arm.name}.seed{self.seed}"

    @property
    def result_path(self) -> Path:
        return self.folder / f"{self.stem}.json"

    @property
    def spec_path(self) -> Path:
        return self.folder / f"{self.stem}.spec.json"

    @property
    def log_path(self) -> Path:
        return self.folder / f"{self.stem}.log"

    @property
    def label(self) -> str:
        return f"{self.study.name} {self.arm.name} seed {self.seed}"

    @property
    def flops(self) -> int:
        return self.arm.steps * self.study.scale.tokens_per_step * \
            training_flops_per_token(self.arm.config)


def run_settings(study: Study, arm: Arm, seed: int, corpus: Corpus, tokens: Tokenized) -> dict:
    """Everything that decides a run's result, as JSON: two runs with equal settings
    compute the same thing (on the CPU, bit for bit)."""
    scale = study.scale
    return {"harness": HARNESS_VERSION, "scale": scale.name, "study": study.name,
            "arm": arm.name, "seed": seed, "config": arm.config.to_dict(),
            "train": training_settings(arm, scale, seed), "tokenizer": tokens.describe(),
            "data": {"sha256": corpus.sha256, "train_chars": len(corpus.train_text),
                     "val_chars": len(corpus.val_text), "train_bytes": corpus.train_bytes,
                     "val_bytes": corpus.val_bytes},
            "eval": {"curve_steps": curve_steps(arm.steps, scale.curve_points),
                     "curve_windows": scale.curve_windows, "eval_batch": scale.eval_batch}}


def first_difference(old: Any, new: Any, path: str = "") -> str | None:
    """The first key path where two JSON values differ, with both values (``old``, the
    file's, then ``new``, the plan's); None if they are equal."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            found = first_difference(old.get(key), new.get(key), f"{path}.{key}" if path else key)
            if found:
                return found
        return None
    if old != new:
        return f"{path or 'settings'} was {_short(old)}, is now {_short(new)}"
    return None


def _short(value: Any, limit: int = 40) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _number(value: Any, low: float = 0.0, high: float = math.inf) -> str | None:
    """Why ``value`` is not a finite number in [low, high]; None if it is one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"is {json.dumps(value)[:40]}, not a number"
    if not math.isfinite(value):
        return f"is {value}, not a finite number"
    if not low <= value <= high:
        return f"is {value:.6g}, outside [{low:g}, {high:.3g}]"
    return None


def _count(value: Any, low: int = 0) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"is {json.dumps(value)[:40]}, not a whole number"
    return None if value >= low else f"is {value}, below {low}"


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b))


def result_problem(record: dict, settings: dict) -> str | None:
    """What is wrong with a run record's result (the first field at fault and why), or
    None when it is one a run with these settings can have produced: every number the
    study, its figures and the site use is there, finite, in its possible range, and the
    numbers agree with each other and with the settings (bits per byte is nats per token ×
    tokens / (bytes · ln 2); each validation token but the first is predicted once; the
    curve is measured at the settings' steps)."""
    result = record.get("result")
    if not isinstance(result, dict):
        return "result is not a JSON object"
    checks: list[tuple[str, str | None]] = [
        ("bits_per_byte", _number(result.get("bits_per_byte"), 0.0, MAX_BITS_PER_BYTE)),
        ("nats_per_token", _number(result.get("nats_per_token"), 0.0, FLOAT32_MAX)),
        ("val_tokens", _count(result.get("val_tokens"), 1)),
        ("val_bytes", _count(result.get("val_bytes"), 1)),
        # every token spells at least one byte
        ("val_tokens_per_byte", _number(result.get("val_tokens_per_byte"), 0.0, 1.0)),
        ("train_tokens_per_byte", _number(result.get("train_tokens_per_byte"), 0.0, 1.0)),
        *((key, _number(result.get(key))) for key in (
            "train_flops", "train_flops_per_byte", "inference_flops_per_byte",
            "train_bytes_seen")),
    ]
    for key, problem in checks:
        if problem:
            return f"result.{key} {problem}"
    seconds = result.get("seconds")
    if not isinstance(seconds, dict):
        return "result.seconds is not a JSON object"
    for key in ("train_wall", "train_cpu", "eval_wall", "eval_cpu", "process_wall"):
        problem = _number(seconds.get(key))
        if problem:
            return f"result.seconds.{key} {problem}"
    tokens, n_bytes = result["val_tokens"], result["val_bytes"]
    if tokens > n_bytes:
        return f"result.val_tokens ({tokens}) exceeds result.val_bytes ({n_bytes})"
    expected = result["nats_per_token"] * tokens / (n_bytes * math.log(2))
    if not _close(result["bits_per_byte"], expected):
        return (f"result.bits_per_byte ({result['bits_per_byte']:.6g}) is not nats_per_token × "
                f"val_tokens / (val_bytes · ln 2) = {expected:.6g}")
    if not _close(result["val_tokens_per_byte"], tokens / n_bytes):
        return "result.val_tokens_per_byte is not val_tokens / val_bytes"
    try:
        split_tokens = settings["tokenizer"]["val_tokens"]
        steps = settings["eval"]["curve_steps"]
    except (KeyError, TypeError):
        return "settings lack tokenizer.val_tokens or eval.curve_steps"
    if tokens != split_tokens - 1:
        return (f"result.val_tokens is {tokens}, and the validation split's {split_tokens} "
                f"tokens predict {split_tokens - 1}")
    curve = result.get("curve")
    if not (isinstance(curve, list) and all(isinstance(p, list) and len(p) == 2 for p in curve)
            and [p[0] for p in curve] == steps):
        return f"result.curve is not one [step, bits per byte] at each of the steps {steps}"
    for step, value in curve:
        problem = _number(value, 0.0, MAX_BITS_PER_BYTE)
        if problem:
            return f"result.curve at step {step} {problem}"
    losses = result.get("train_loss")
    if not (isinstance(losses, list) and all(
            isinstance(p, list) and len(p) == 2 and not any(map(_number, p)) for p in losses)):
        return "result.train_loss is not a list of [step, loss] pairs of finite numbers ≥ 0"
    provenance = record.get("provenance", {})
    if not isinstance(provenance, dict) or not isinstance(provenance.get("commit"), str | None):
        return "provenance is not a JSON object with a commit"
    return None


def _run_record_json(text: str) -> Any:
    """A run record's JSON as Python's json reads it, NaN included (a record holding one
    is a damaged result, run again: ``result_problem``, where ``parse_json`` would make it
    a file to delete); nesting deeper than the parser follows is a ValueError, not a
    RecursionError that named no file."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("not valid JSON: nested too deeply") from None


def finished(run: PlannedRun, note: Callable[[str], None] | None = None) -> dict | None:
    """The run's earlier result if it has one with these settings; None if it has none,
    or if its result is not one a run can produce (``result_problem``: the run is done
    again, and ``note`` gets one line naming the file and the field); ExperimentError if
    its file holds other settings or cannot be read."""
    path = run.result_path
    if not path.exists():
        return None
    try:
        record = _run_record_json(path.read_text(encoding="utf-8"))
        if not isinstance(record, dict) or record.get("schema") != RUN_SCHEMA:
            raise ValueError(f"not a {RUN_SCHEMA} file")
        settings = record["settings"]
        if not isinstance(settings, dict):
            raise ValueError("its settings are not a JSON object")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ExperimentError(f"{path} cannot be read ({err}); delete it to run "
                              f"{run.label} again") from None
    differs = first_difference(settings, run.settings)
    if differs:
        raise ExperimentError(f"{path} holds a run made with other settings ({differs}); "
                              f"delete it, or {run.folder}, to recompute with these")
    # The file is this run's own result (its schema, these settings), so it is the
    # study's to replace: a damaged one is a cache miss, computed again (the same number,
    # bit for bit on the CPU), not a reason to stop a study that may take hours.
    problem = result_problem(record, settings)
    if problem:
        if note is not None:
            note(f"  {path}: {problem}; running {run.label} again")
        return None
    return record


def plan(studies: Sequence[Study], seeds: int, corpus: Corpus, tokens: dict[int, Tokenized],
         out: Path) -> list[PlannedRun]:
    return [PlannedRun(s, arm, seed, run_settings(s, arm, seed, corpus, tokens[arm.vocab]),
                       tokens[arm.vocab], out / ".runs" / s.name)
            for s in studies for arm in s.arms for seed in range(seeds)]


def prepare(studies: Sequence[Study], corpus: Corpus, out: Path,
            log: Callable[[str], None]) -> dict[int, Tokenized]:
    """Every tokenizer the studies need, trained on the training split, and both splits
    encoded; refuses a corpus whose splits are too short for the models' context."""
    problem = corpus_problem(studies, corpus)  # before a tokenizer is trained
    if problem is not None:
        raise ExperimentError(problem)
    vocabs = sorted({arm.vocab for s in studies for arm in s.arms})
    tokens = {}
    for v in vocabs:
        start = time.perf_counter()
        try:
            tokens[v] = tokenize(corpus, v, out / ".cache", note=log)
        except ValueError as err:
            raise ExperimentError(f"the corpus is too short: {err}") from None
        log(f"  tokenizer {'bytes' if v == 256 else f'BPE {v}'}: {tokens[v].train_tokens:,} "
            f"training and {tokens[v].val_tokens:,} validation tokens "
            f"({time.perf_counter() - start:.1f} s)")
    for s in studies:
        need = s.scale.n_ctx + 1
        for arm in s.arms:
            t = tokens[arm.vocab]
            if min(t.train_tokens, t.val_tokens) < max(need, s.scale.curve_windows):
                raise ExperimentError(
                    f"the corpus is too short: with {arm.label} its splits hold "
                    f"{t.train_tokens:,} and {t.val_tokens:,} tokens, and the {s.name} study "
                    f"needs at least {max(need, s.scale.curve_windows):,} in each")
    return tokens


# --- processes -----------------------------------------------------------------------------


@dataclass
class _Running:
    run: PlannedRun
    process: subprocess.Popen
    started: float
    log: Any


def _start(run: PlannedRun) -> _Running:
    run.folder.mkdir(parents=True, exist_ok=True)
    spec = {"settings": run.settings, "launched": time.time(),
            # the worker ends with this process (parent_death), even when it is SIGKILLed
            "parent": os.getpid(),
            "paths": {"tokenizer": str(run.tokens.tokenizer.resolve()),
                      "train": str(run.tokens.train.resolve()),
                      "val": str(run.tokens.val.resolve()),
                      "result": str(run.result_path.resolve())},
            # what the cache's record holds of each file, checked again by the run
            "sha256": run.tokens.sha256}
    write_text(run.spec_path, json.dumps(spec, indent=1) + "\n")
    # one thread per run: the runs are the parallelism (and one thread's results do not
    # depend on how many cores the machine has)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    log = _open_log(run.log_path)  # closed once the process has ended
    process = subprocess.Popen([sys.executable, "-m", "gptspec.experiments.worker",
                                str(run.spec_path)], stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, env=env)
    return _Running(run, process, time.perf_counter(), log)


def _not_replaceable(path: Path) -> str | None:
    """Why the run may not write ``path`` (a symbolic link, a folder, a FIFO…: not a file of
    its own), or None where it is a regular file or there is nothing there."""
    if path.is_symlink():
        return f"{path} is a symbolic link, not a file this run can replace; remove it"
    if path.exists() and not path.is_file():
        return f"{path} is not a regular file, not a file this run can replace; remove it"
    return None


def check_run_files(studies: Sequence[Study], seeds: int, out: Path) -> None:
    """Refuse (ExperimentError, naming it) a run's working file in OUT/.runs that is a
    link or not a regular file, before anything is made or run: the log was opened
    through a link, emptying the file it pointed to, and the spec written over it."""
    for study in studies:
        for arm in study.arms:
            for seed in range(seeds):
                folder, stem = out / ".runs" / study.name, f"{arm.name}.seed{seed}"
                for suffix in (".log", ".spec.json", ".json"):  # PlannedRun's paths
                    problem = _not_replaceable(folder / f"{stem}{suffix}")
                    if problem:
                        raise ExperimentError(problem)


def _open_log(path: Path) -> Any:
    """The run's log, emptied, for writing: never through a link (O_NOFOLLOW), never
    waiting on a FIFO (O_NONBLOCK), and only a regular file (ExperimentError naming it
    otherwise); checked on the opened file, so a link put there meanwhile is no way in."""
    flags = (os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK
             | getattr(os, "O_CLOEXEC", 0))
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as err:
        problem = _not_replaceable(path)
        if problem:
            raise ExperimentError(problem) from None
        raise OSError(err.errno, err.strerror, str(path)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ExperimentError(f"{path} is not a regular file, not a file this run can "
                              "replace; remove it")
    os.set_blocking(fd, True)
    os.ftruncate(fd, 0)  # emptied only now: it is the run's own file
    return os.fdopen(fd, "w", encoding="utf-8")


def bpb_text(value: Any) -> str:
    """Bits per byte to 4 decimals; a number too large for that (a diverged run's,
    possible up to ``MAX_BITS_PER_BYTE``) in 4 significant digits, not 39 of them."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:.4f}" if abs(value) < 1e6 else f"{value:.4g}"
    return repr(value)


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines()
                 if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1].strip()[:200] if lines else "no output"


def execute(runs: Sequence[PlannedRun], jobs: int, log: Callable[[str], None],
            done_before: int = 0, total: int | None = None) -> list[str]:
    """Run each as ``python -m gptspec.experiments.worker`` with up to ``jobs`` at once,
    the costliest first (fewer idle cores at the end). Returns one line per failed run.
    Ctrl-C, SIGTERM or SIGHUP stops the running processes (their runs are left undone)
    and the KeyboardInterrupt the signal's handler raised goes on: the gptspec command's
    own (``Terminated``, ``HungUp``: 143 and 129, as for train), or, where SIGTERM has no
    handler (a caller of this function), ``Stopped``."""
    queue = sorted(runs, key=lambda r: -r.flops)
    total = len(runs) + done_before if total is None else total
    running: list[_Running] = []
    failures: list[str] = []
    count = done_before

    def stop(signum: int, frame: Any) -> None:
        raise Stopped(signum)

    # the command's handler is kept: replaced, SIGTERM was reported as a Ctrl-C (130)
    default = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    previous = signal.signal(signal.SIGTERM, stop) if default else None
    try:
        while queue or running:
            while queue and len(running) < jobs:
                running.append(_start(queue.pop(0)))
            time.sleep(0.05)
            for r in [r for r in running if r.process.poll() is not None]:
                running.remove(r)
                r.log.close()
                took = time.perf_counter() - r.started
                count += 1
                if r.process.returncode == 0 and r.run.result_path.exists():
                    bpb = json.loads(r.run.result_path.read_text())["result"]["bits_per_byte"]
                    log(f"  [{count}/{total}] {r.run.label}: {bpb_text(bpb)} bits per byte "
                        f"({took:.0f} s)")
                else:
                    failures.append(f"{r.run.label} failed (exit {r.process.returncode}): "
                                    f"{_last_line(r.run.log_path)} — log: {r.run.log_path}")
                    log(f"  [{count}/{total}] {failures[-1]}")
    except BaseException:  # a signal, or a run that cannot start (its log refused)
        for r in running:
            r.process.terminate()  # our own children, by their handles
        for r in running:
            try:
                r.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                r.process.kill()
                r.process.wait()
            r.log.close()
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return failures


# --- results -------------------------------------------------------------------------------


def describe_design(study: Study, seeds: int) -> dict:
    scale = study.scale
    common = {k: getattr(scale, k) for k in (
        "d_model", "n_layers", "n_heads", "n_ctx", "batch_size", "val_fraction", "lr",
        "min_lr", "warmup_fraction", "weight_decay", "grad_clip", "curve_points",
        "curve_windows", "eval_batch")}
    from gptspec.experiments.studies import non_embedding_params

    return {"baseline": study.baseline, "matched": study.matched, "varied": study.varied,
            "seeds": list(range(seeds)), "common": common,
            "arms": [{"name": a.name, "label": a.label, "vocab": a.vocab,
                      "config": a.config.to_dict(), "steps": a.steps, "x": a.x,
                      "group": a.group, "params": param_count_total(a.config),
                      "non_embedding_params": non_embedding_params(a.config),
                      "train_flops": a.steps * scale.tokens_per_step
                      * training_flops_per_token(a.config)}
                     for a in study.arms],
            "comparisons": [{"a": c.a, "b": c.b, "matched": c.matched}
                            for c in study.comparisons]}


def study_results(study: Study, runs: Sequence[PlannedRun], records: dict[str, dict],
                  corpus: Corpus, seeds: int, started: dict, command: dict) -> dict:
    """The study's JSON (without its figures' hashes, which the caller adds)."""
    from gptspec.conformance.report import provenance

    rows = []
    for r in runs:
        record = records[str(r.result_path)]
        rows.append({"arm": r.arm.name, "seed": r.seed, "settings": record["settings"],
                     "result": record["result"], "provenance": record.get("provenance", {})})
    design = describe_design(study, seeds)
    commits = sorted({(row["provenance"].get("commit") or "?")[:10]
                      + ("+" if row["provenance"].get("modified") else "") for row in rows})
    process = sum(row["result"]["seconds"]["process_wall"] for row in rows)
    return {
        "schema": STUDY_SCHEMA, "version": 1, "study": study.name, "title": study.title,
        "question": study.question, "quick": study.scale.name != "full",
        "scale": study.scale.name, "design": design,
        "data": {"source": corpus.source, "sha256": corpus.sha256,
                 "train_chars": len(corpus.train_text), "val_chars": len(corpus.val_text),
                 "train_bytes": corpus.train_bytes, "val_bytes": corpus.val_bytes},
        "provenance": {**provenance(), "torch": _version("torch"), "numpy": _version("numpy"),
                       "started": started["date"], "command": command, "run_commits": commits,
                       "run_process_seconds": round(process, 1)},
        "runs": rows,
        "summary": summarize(design["arms"], design["comparisons"], rows),
    }


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def study_outputs(study: str, out: Path) -> list[Path]:
    """The files a study writes in OUT: its JSON, then its figures."""
    return [out / f"{study}.json", *(out / name for name in figure_names(study))]


def _figures_record(study: str, out: Path) -> Path:
    return out / ".runs" / study / "figures.json"


def _recorded_figures(path: Path) -> dict[str, set[str]]:
    """Figure name → the SHA-256s a record (the study's JSON, or the figures record)
    holds; empty if the file is missing or holds none."""
    try:
        data = parse_json(path.read_text(encoding="utf-8"))
        figures = data["figures"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    if not isinstance(figures, dict):
        return {}
    return {name: {d for d in (digests if isinstance(digests, list) else [digests])
                   if isinstance(d, str)} for name, digests in figures.items()}


def _owned(study: str, out: Path) -> dict[Path, str | None]:
    """Each of the study's outputs in OUT that exists → its SHA-256 (None for the JSON),
    once it is known to be the study's own; ExperimentError naming the first that is not
    (a user's file of the same name, which the study would replace)."""
    json_path, *figure_paths = study_outputs(study, out)
    owned: dict[Path, str | None] = {}
    advice = f"the {study} study writes its results there: move it away or choose another --out"
    for path in (json_path, *figure_paths):
        if (path.exists() or path.is_symlink()) and not path.is_file():
            raise ExperimentError(f"{path} is not a regular file; {advice}")
    recorded: dict[str, set[str]] = {}
    if json_path.is_file():
        try:
            data = parse_json(json_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ExperimentError(f"{json_path} is not a {STUDY_SCHEMA} file (it cannot be read "
                                  f"as JSON: {str(err)[:60]}); {advice}") from None
        if not isinstance(data, dict) or data.get("schema") != STUDY_SCHEMA:
            raise ExperimentError(f"{json_path} is not a {STUDY_SCHEMA} file; {advice}")
        if data.get("study") != study:
            raise ExperimentError(f"{json_path} holds the results of the study "
                                  f"{json.dumps(data.get('study'))[:40]}, not {study}; {advice}")
        owned[json_path] = None
        recorded = _recorded_figures(json_path)
    for name, digests in _recorded_figures(_figures_record(study, out)).items():
        recorded.setdefault(name, set()).update(digests)
    for path in figure_paths:
        if not path.is_file():
            continue
        try:
            digest = file_sha256(path)
        except OSError as err:
            raise ExperimentError(f"{path} cannot be read ({err.strerror or err}); "
                                  f"{advice}") from None
        if digest not in recorded.get(path.name, set()):
            raise ExperimentError(f"{path} is not a figure the {study} study drew (no results "
                                  f"of it in {out} record its SHA-256); {advice}")
        owned[path] = digest
    return owned


def check_outputs(studies: Sequence[str], out: Path) -> None:
    """Refuse, naming it, a file in OUT that a study would replace and did not write."""
    for study in studies:
        _owned(study, out)


def write_study(data: dict, out: Path) -> list[Path]:
    """The figures (SVG, by matplotlib) and then the study's JSON with their hashes; first
    the figures' hashes (old and new) in OUT/.runs/<study>/figures.json, so that figures
    written by a study killed before its JSON are still known as its own. Refuses
    (ExperimentError) if one of the files is not the study's own (see ``_owned``)."""
    from gptspec.experiments.plots import figures

    study = data["study"]
    owned = _owned(study, out)  # again: a file may have been put there since the start
    drawn = figures(data)
    hashes = {name: hashlib.sha256(svg).hexdigest() for name, svg in drawn.items()}
    pending = {}
    for name, digest in hashes.items():
        earlier = owned.get(out / name)
        pending[name] = sorted({digest} if earlier is None else {digest, earlier})
    write_text(_figures_record(study, out),
               json.dumps({"schema": FIGURES_SCHEMA, "figures": pending}, indent=1) + "\n",
               make_parents=True)
    written = []
    for name, svg in drawn.items():
        write_bytes(out / name, svg, make_parents=True)
        written.append(out / name)
    data = {**data, "figures": hashes}
    path = out / f"{study}.json"
    write_text(path, json.dumps(data, indent=1, sort_keys=False) + "\n", make_parents=True)
    return [path, *written]


def run_studies(studies: Sequence[Study], corpus: Corpus, out: Path, jobs: int, seeds: int,
                command: dict, log: Callable[[str], None] = print) -> int:
    """Prepare, run what is missing, write each study whose runs all finished. Returns 0,
    or 1 when a run failed (the others are kept)."""
    from gptspec.conformance.report import provenance

    started = provenance()
    wall = time.perf_counter()
    check_outputs([s.name for s in studies], out)  # before anything is made or run
    check_run_files(studies, seeds, out)
    log(f"corpus: {corpus.source}: {corpus.train_bytes:,} bytes for training, "
        f"{corpus.val_bytes:,} for validation")
    tokens = prepare(studies, corpus, out, log)
    runs = plan(studies, seeds, corpus, tokens, out)
    records = {}
    for r in runs:  # every conflict is refused before anything runs
        record = finished(r, note=log)
        if record is not None:
            records[str(r.result_path)] = record
    todo = [r for r in runs if str(r.result_path) not in records]
    log(f"{len(runs)} runs: {len(records)} finished earlier, {len(todo)} to run, "
        f"{min(jobs, max(1, len(todo)))} at a time")
    failures = execute(todo, jobs, log, done_before=len(records), total=len(runs))
    for r in todo:  # checked as an earlier result is (a failed rerun left the old file)
        record = finished(r)
        if record is not None:
            records[str(r.result_path)] = record
    for study in studies:
        mine = [r for r in runs if r.study is study]
        if any(str(r.result_path) not in records for r in mine):
            log(f"{study.name}: not written, some of its runs did not finish")
            continue
        data = study_results(study, mine, records, corpus, seeds, started,
                             {**command, "jobs": jobs, "wall_seconds":
                              round(time.perf_counter() - wall, 1)})
        paths = write_study(data, out)
        best = data["summary"]["best"]
        log(f"{study.name}: {paths[0]} and {len(paths) - 1} figures; lowest validation loss: "
            f"{best} ({bpb_text(data['summary']['arms'][best]['bits_per_byte']['mean'])} "
            "bits per byte)")
    log(f"done in {(time.perf_counter() - wall) / 60:.1f} min")
    for line in failures:
        log(f"failed: {line}")
    return 1 if failures else 0
