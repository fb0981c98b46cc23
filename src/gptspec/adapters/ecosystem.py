"""The ecosystem run: every adapter through the conformance suite in every dtype its engine
computes in, one JSON report per engine × dtype, every failure held against a committed
table of adjudications (``nox -s ecosystem``; ``--profile quick`` in CI).

``ENGINES`` is the one table of what is run: an engine joins with one line (entry-point
name, dtypes, extra). Each run is ``gptspec conformance`` in a process of its own, so the
report carries the suite's provenance and the engine's versions. ``ADJUDICATIONS``
(``docs/ecosystem/adjudications.toml``) explains each failed or erring check per engine
and check: ``engine``, ``spec-reading`` or ``false-alarm`` (the suite's, to be fixed), a
reason and the smallest input that shows it. A failure without one makes this run exit 1
and the docs build fail.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]  # the checkout: src/gptspec/adapters/
REPORT_DIR = Path("docs") / "ecosystem"
ADJUDICATIONS = REPORT_DIR / "adjudications.toml"
VERDICTS = {
    "engine": "the engine's behaviour (a bug or a limitation of the engine)",
    "spec-reading": "a decision of the spec that the engine reads differently",
    "false-alarm": "a false alarm of the suite (to be fixed in gptspec)",
}
NEEDS_ADJUDICATION = ("fail", "error")
# The per-check limit stops a hang; it is not a speed test. An engine that compiles per
# shape (XLA compiles the JAX generation step once per configuration) ran past the suite's
# default 300 s on generate.every_variant on a shared 2-core machine, correct (453 s).
TIMEOUT_S = 1200.0


@dataclass(frozen=True)
class Engine:
    backend: str  # the entry-point name in gptspec.backends
    dtypes: tuple[str, ...]  # every dtype the engine computes in
    extra: str  # the optional dependency that installs the engine
    what: str  # one line for the Compatibility page
    # an implementation nobody here wrote (True), or the spec's equations re-written here in
    # another framework (False: the JAX and ONNX adapters), which the page shows apart
    independent: bool = True
    areas: tuple[str, ...] = ("model",)  # the areas judged (protocol.CAPABILITIES' names)


MODEL_AREAS = ("model", "gradients", "optimizer", "sampling")
ENGINES: tuple[Engine, ...] = (
    Engine("hf-eager", ("float32", "bfloat16"), "interop",
           "GPT2LMHeadModel of transformers, GPT-2's own attention; logits, generate(), "
           "GPT-2's block, attention, MLP, Conv1D, LayerNorm, activation, embedding and "
           "lm_head modules, its loss and autograd's gradients",
           areas=("model", "gradients", "sampling")),
    Engine("hf-sdpa", ("float32", "bfloat16"), "interop",
           "GPT2LMHeadModel of transformers, PyTorch's fused SDPA attention; as hf-eager "
           "otherwise", areas=("model", "gradients", "sampling")),
    Engine("hf-logits", ("float32", "bfloat16"), "interop",
           "GPT2LMHeadModel of transformers (SDPA attention) as most engines are brought: "
           "logits only; judged through the probes, generation and sampling through its "
           "forward", areas=("model",)),
    Engine("hf-onnx", ("float32", "float16"), "interop-onnx",
           "GPT2LMHeadModel of transformers (eager attention), exported to ONNX by torch.onnx "
           "and run by ONNX Runtime's CPU provider, not optimum: logits only, as hf-logits "
           "(ORT's CPU provider has no bfloat16 kernels for it)", areas=("model",)),
    Engine("tiktoken", ("float64",), "",
           "tiktoken's Encoding built from the spec's merges as byte ranks; encodes and decodes "
           "(it has no trainer)", areas=("tokenizer",)),
    Engine("hf-tokenizers", ("float64",), "",
           "Hugging Face tokenizers: a byte-level BPE model built from the spec's merges, and "
           "its own BpeTrainer", areas=("tokenizer",)),
    Engine("torch-adamw-foreach", ("float32", "bfloat16"), "independent",
           "torch.optim.AdamW(foreach=True) on parameters of the dtype", areas=("optimizer",)),
    Engine("torch-adamw-fused", ("float32", "bfloat16"), "independent",
           "torch.optim.AdamW(fused=True) on parameters of the dtype", areas=("optimizer",)),
    Engine("optax-adamw", ("float32", "bfloat16"), "independent",
           "optax.adamw (JAX) on parameters of the dtype", areas=("optimizer",)),
    Engine("torch-lr-scheduler", ("float32",), "independent",
           "torch.optim.lr_scheduler's LinearLR, CosineAnnealingLR and ConstantLR chained by "
           "SequentialLR", areas=("schedule",)),
    Engine("hf-cosine-schedule", ("float32",), "independent",
           "transformers' get_cosine_with_min_lr_schedule_with_warmup", areas=("schedule",)),
    Engine("jax", ("float32", "bfloat16"), "jax",
           "The spec's equations in JAX, jit-compiled by XLA on the CPU; every operation exposed",
           independent=False, areas=MODEL_AREAS),
    Engine("onnxruntime", ("float32", "float16", "bfloat16"), "onnx",
           "ONNX graphs written from the spec's equations, run by ONNX Runtime's CPU provider; "
           "every operation exposed", independent=False, areas=("model", "sampling")),
)


class AdjudicationError(ValueError):
    """The adjudication table cannot be read, or a failure is not in it; the message says
    which."""


@dataclass(frozen=True)
class Adjudication:
    engine: str
    check: str
    dtypes: tuple[str, ...]  # empty: every dtype
    verdict: str  # a key of VERDICTS
    reason: str
    smallest_input: str

    def covers(self, engine: str, check: str, dtype: str) -> bool:
        return (self.engine == engine and self.check == check
                and (not self.dtypes or dtype in self.dtypes))


def load_adjudications(path: Path) -> list[Adjudication]:
    """The committed table; a missing file is an empty table."""
    if not path.exists():
        return []
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise AdjudicationError(f"adjudications {path}: cannot be read: {err}") from None
    table = []
    for i, item in enumerate(data.get("adjudication", []), 1):
        where = f"adjudications {path}: entry {i}"
        if not isinstance(item, dict):
            raise AdjudicationError(f"{where} is not a table")
        missing = [k for k in ("engine", "check", "verdict", "reason", "smallest_input")
                   if not isinstance(item.get(k), str) or not item[k].strip()]
        if missing:
            raise AdjudicationError(f"{where} lacks {', '.join(missing)}")
        if item["verdict"] not in VERDICTS:
            raise AdjudicationError(f"{where}: verdict {item['verdict']!r} is not one of "
                                    f"{', '.join(VERDICTS)}")
        dtypes = item.get("dtypes", [])
        if not isinstance(dtypes, list) or not all(isinstance(d, str) for d in dtypes):
            raise AdjudicationError(f"{where}: dtypes must be a list of dtype names")
        table.append(Adjudication(item["engine"], item["check"], tuple(dtypes), item["verdict"],
                                  item["reason"].strip(), item["smallest_input"].strip()))
    return table


def find_adjudication(table: Iterable[Adjudication], engine: str, check: str,
                      dtype: str) -> Adjudication | None:
    return next((a for a in table if a.covers(engine, check, dtype)), None)


def failures(report: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(engine, dtype, check) for every check of a report that failed or erred."""
    out = []
    for run in report.get("runs", []):
        backend = run.get("backend", {})
        for check in run.get("checks", []):
            if check.get("status") in NEEDS_ADJUDICATION:
                out.append((str(backend.get("name")), str(backend.get("dtype")), check))
    return out


def unexplained(reports: Iterable[dict[str, Any]], table: list[Adjudication]) -> list[str]:
    """One line per failure that no adjudication covers (empty: all explained)."""
    return [f"{engine} {dtype}: {check['id']} {check['status']}ed with no adjudication in "
            f"{ADJUDICATIONS} ({str(check.get('detail', ''))[:120]})"
            for report in reports for engine, dtype, check in failures(report)
            if find_adjudication(table, engine, check["id"], dtype) is None]


def report_name(engine: str, dtype: str) -> str:
    return f"{engine}-{dtype}.json"


def run_engine(engine: Engine, dtype: str, out: Path, profile: str, seed: int,
               checks: Iterable[str] = (), timeout: float | None = None) -> int:
    """One engine in one dtype through the whole suite (or the ``checks`` patterns), in a
    process of its own; its exit status (0 all passed, 1 some check failed, 2 the backend
    could not be run)."""
    command = [sys.executable, "-m", "gptspec", "conformance", "--backend", engine.backend,
               "--dtype", dtype, "--profile", profile, "--seed", str(seed), "--area", "all",
               "--report", str(out / report_name(engine.backend, dtype))]
    for pattern in checks:
        command += ["--check", pattern]
    if timeout is not None:
        command += ["--timeout", f"{timeout:g}"]
    print(f"\n== {engine.backend} {dtype}: {' '.join(command[1:])}", flush=True)
    return subprocess.run(command, check=False).returncode


def main(argv: list[str] | None = None, engines: Iterable[Engine] = ENGINES) -> int:
    """The command line; ``engines`` replaces the table (the tests run a tiny one)."""
    import json

    engines = tuple(engines)
    parser = argparse.ArgumentParser(prog="python -m gptspec.adapters.ecosystem",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="default", choices=("quick", "default", "thorough"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / REPORT_DIR,
                        help=f"folder for the reports (default {REPORT_DIR})")
    parser.add_argument("--engine", action="append", metavar="NAME",
                        choices=[e.backend for e in engines], help="only these (repeatable)")
    parser.add_argument("--dtype", action="append", metavar="DTYPE",
                        help="only these of each engine's dtypes (repeatable; CI: float32)")
    parser.add_argument("--check", action="append", default=[], metavar="PATTERN",
                        help="only these checks (glob, repeatable), to investigate one")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="SECONDS",
                        help=f"time limit per check (default {TIMEOUT_S:g})")
    parser.add_argument("--adjudications", type=Path, default=ROOT / ADJUDICATIONS)
    args = parser.parse_args(argv)
    try:
        table = load_adjudications(args.adjudications)
    except AdjudicationError as err:
        print(f"ecosystem: {err}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    problems, reports = [], []
    for engine in engines:
        if args.engine and engine.backend not in args.engine:
            continue
        for dtype in engine.dtypes:
            if args.dtype and dtype not in args.dtype:
                continue
            status = run_engine(engine, dtype, args.out, args.profile, args.seed, args.check,
                                args.timeout)
            path = args.out / report_name(engine.backend, dtype)
            if status not in (0, 1) or not path.exists():
                problems.append(f"{engine.backend} {dtype}: the suite could not run it "
                                f"(exit {status}; is the "
                                + (f"'{engine.extra}' extra" if engine.extra else "engine")
                                + " installed?)")
                continue
            reports.append(json.loads(path.read_text(encoding="utf-8")))
    problems += unexplained(reports, table)
    print()
    for line in problems:
        print(f"ecosystem: {line}", file=sys.stderr)
    if problems:
        return 1
    print(f"ecosystem: {len(reports)} reports in {args.out}; every failure is adjudicated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
