"""Running studies: prepare the tokenizations, plan every run, run the missing ones as
independent processes, and write each study's results and figures.

Under the output folder OUT: ``OUT/<study>.json`` (schema ``gptspec-experiment``: design,
data, provenance, every run, the summary, each figure's SHA-256) and ``OUT/<study>-*.svg``;
working state, neither committed nor on the site, under ``OUT/.runs/<study>/`` (one
``<arm>.seed<k>.json`` per finished run) and ``OUT/.cache/`` (tokenizers, token files).
Resuming: a run whose result file has the same settings is not run again; one whose file
holds *other* settings is refused before anything starts, naming the file and the first
difference (delete it to recompute). Each file is written whole, then renamed, so a
killed study continues when the same command is rerun.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptspec.atomic_files import write_bytes, write_text
from gptspec.experiments.corpus import Corpus, Tokenized, tokenize
from gptspec.experiments.studies import Arm, Study, curve_steps, training_settings
from gptspec.experiments.summary import summarize
from gptspec.reference.costs import param_count_total, training_flops_per_token

HARNESS_VERSION = 1  # bump when a run would compute something else from the same settings
STUDY_SCHEMA = "gptspec-experiment"
RUN_SCHEMA = "gptspec-experiment-run"


class ExperimentError(Exception):
    """A study that cannot go on (conflicting earlier results, a corpus too short); the
    message is one line naming the problem."""


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
        return f"{path or 'settings'} was {json.dumps(old)[:40]}, is now {json.dumps(new)[:40]}"
    return None


def finished(run: PlannedRun) -> dict | None:
    """The run's earlier result if it has one with these settings; None if it has none;
    ExperimentError if its file holds other settings or cannot be read."""
    path = run.result_path
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        settings = record["settings"]
        record["result"]["bits_per_byte"]  # noqa: B018 (present, or the file is not a result)
        if record.get("schema") != RUN_SCHEMA:
            raise ValueError("not a gptspec-experiment-run file")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ExperimentError(f"{path} cannot be read ({err}); delete it to run "
                              f"{run.label} again") from None
    differs = first_difference(settings, run.settings)
    if differs:
        raise ExperimentError(f"{path} holds a run made with other settings ({differs}); "
                              f"delete it, or {run.folder}, to recompute with these")
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
    vocabs = sorted({arm.vocab for s in studies for arm in s.arms})
    tokens = {}
    for v in vocabs:
        start = time.perf_counter()
        try:
            tokens[v] = tokenize(corpus, v, out / ".cache")
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
            "paths": {"tokenizer": str(run.tokens.tokenizer.resolve()),
                      "train": str(run.tokens.train.resolve()),
                      "val": str(run.tokens.val.resolve()),
                      "result": str(run.result_path.resolve())}}
    write_text(run.spec_path, json.dumps(spec, indent=1) + "\n")
    # one thread per run: the runs are the parallelism (and one thread's results do not
    # depend on how many cores the machine has)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    log = open(run.log_path, "w", encoding="utf-8")  # noqa: SIM115 (closed in _finish)
    process = subprocess.Popen([sys.executable, "-m", "gptspec.experiments.worker",
                                str(run.spec_path)], stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, env=env)
    return _Running(run, process, time.perf_counter(), log)


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
    Ctrl-C or SIGTERM stops the running processes (their runs are left undone) and
    raises KeyboardInterrupt."""
    queue = sorted(runs, key=lambda r: -r.flops)
    total = len(runs) + done_before if total is None else total
    running: list[_Running] = []
    failures: list[str] = []
    count = done_before

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
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
                    log(f"  [{count}/{total}] {r.run.label}: {bpb:.4f} bits per byte "
                        f"({took:.0f} s)")
                else:
                    failures.append(f"{r.run.label} failed (exit {r.process.returncode}): "
                                    f"{_last_line(r.run.log_path)} — log: {r.run.log_path}")
                    log(f"  [{count}/{total}] {failures[-1]}")
    except KeyboardInterrupt:
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


def write_study(data: dict, out: Path) -> list[Path]:
    """The figures (SVG, by matplotlib) and then the study's JSON with their hashes."""
    from gptspec.experiments.plots import figures

    written, hashes = [], {}
    for name, svg in figures(data).items():
        write_bytes(out / name, svg, make_parents=True)
        hashes[name] = hashlib.sha256(svg).hexdigest()
        written.append(out / name)
    data = {**data, "figures": hashes}
    path = out / f"{data['study']}.json"
    write_text(path, json.dumps(data, indent=1, sort_keys=False) + "\n", make_parents=True)
    return [path, *written]


def run_studies(studies: Sequence[Study], corpus: Corpus, out: Path, jobs: int, seeds: int,
                command: dict, log: Callable[[str], None] = print) -> int:
    """Prepare, run what is missing, write each study whose runs all finished. Returns 0,
    or 1 when a run failed (the others are kept)."""
    from gptspec.conformance.report import provenance

    started = provenance()
    wall = time.perf_counter()
    log(f"corpus: {corpus.source}: {corpus.train_bytes:,} bytes for training, "
        f"{corpus.val_bytes:,} for validation")
    tokens = prepare(studies, corpus, out, log)
    runs = plan(studies, seeds, corpus, tokens, out)
    records = {}
    for r in runs:  # every conflict is refused before anything runs
        record = finished(r)
        if record is not None:
            records[str(r.result_path)] = record
    todo = [r for r in runs if str(r.result_path) not in records]
    log(f"{len(runs)} runs: {len(records)} finished earlier, {len(todo)} to run, "
        f"{min(jobs, max(1, len(todo)))} at a time")
    failures = execute(todo, jobs, log, done_before=len(records), total=len(runs))
    for r in todo:
        if r.result_path.exists():
            records[str(r.result_path)] = json.loads(r.result_path.read_text(encoding="utf-8"))
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
            f"{best} ({data['summary']['arms'][best]['bits_per_byte']['mean']:.4f} bits per byte)")
    log(f"done in {(time.perf_counter() - wall) / 60:.1f} min")
    for line in failures:
        log(f"failed: {line}")
    return 1 if failures else 0
