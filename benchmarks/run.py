"""Run every benchmark: ``nox -s bench [-- --quick --corpus PATH --out DIR]``.

The machine's limits are measured first (benchmarks/machine.py), then every other module
``benchmarks/<area>.py`` that defines ``run(report, quick)``, each for several rounds.
A metric's figure is the median over the rounds (each round's value is itself a median
of several timed runs, see benchmarks/report.py); a ratio's figure is the median of the
ratios measured within each round, so a ratio always compares peers measured together.
Throughputs in FLOP/s (and byte rates noted "memory-bound") are also given as a fraction
of the matching measured limit. Writes ``bench.json`` and ``bench.md`` into the output directory.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import json
import os
import platform
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from benchmarks.report import Report  # noqa: E402
from gptspec.atomic_files import write_text  # noqa: E402

# Run first, in this order; any other module with run(report, quick) follows, by name.
ORDER = ("machine", "forward", "training", "generation", "tokenizer", "gpu",
         "conformance_time")
NOT_BENCHMARKS = {"__init__", "run", "report", "cuda_profile"}  # cuda_profile: a diagnostic

# Units a throughput may be recorded in, as (scale to base unit, kind of limit).
RATE_UNITS = {
    "FLOP/s": (1.0, "flops"), "GFLOP/s": (1e9, "flops"), "TFLOP/s": (1e12, "flops"),
    "B/s": (1.0, "bytes"), "MB/s": (1e6, "bytes"), "GB/s": (1e9, "bytes"),
}


@dataclass
class Module:
    name: str
    run: Callable[..., Any]


@dataclass
class Result:
    """Everything measured: per-round reports, merged into medians by :func:`merge`."""

    rounds: list[Report] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def discover(directory: Path = ROOT / "benchmarks", package: str = "benchmarks"
             ) -> list[Module]:
    """The benchmark modules present: the ORDER first, then the rest by name."""
    names = sorted(p.stem for p in directory.glob("*.py") if p.stem not in NOT_BENCHMARKS)
    names.sort(key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))
    modules = []
    for name in names:
        module = importlib.import_module(f"{package}.{name}")
        fn = getattr(module, "run", None)
        if callable(fn):
            modules.append(Module(name, fn))
    return modules


def call(module: Module, report: Report, quick: bool, corpus: str | None) -> None:
    """``run(report, quick)``, plus ``corpus=`` for modules that take one."""
    params = inspect.signature(module.run).parameters
    if "corpus" in params:
        module.run(report, quick, corpus=corpus)
    else:
        module.run(report, quick)


def run_all(modules: Sequence[Module], rounds: int, quick: bool, corpus: str | None = None,
            log: Callable[[str], None] = print) -> Result:
    """Every module, ``rounds`` times, each round into its own Report. A module that
    raises is recorded (once) and skipped in later rounds; the others go on."""
    result = Result()
    failed: set[str] = set()
    for r in range(rounds):
        report = Report()
        for module in modules:
            if module.name in failed:
                continue
            log(f"[bench] round {r + 1}/{rounds}: {module.name}")
            t0 = time.perf_counter()
            try:
                call(module, report, quick, corpus)
            except Exception as err:  # a broken benchmark must not hide the others
                failed.add(module.name)
                line = f"{type(err).__name__}: {err}".splitlines()[0]
                result.errors.append({"module": module.name, "error": line,
                                      "traceback": traceback.format_exc()})
                log(f"[bench] {module.name} failed: {line}")
            result.seconds[module.name] = (result.seconds.get(module.name, 0.0)
                                           + time.perf_counter() - t0)
        result.rounds.append(report)
    return result


def _median_rows(items: list[tuple[tuple[str, str], float, dict[str, Any]]]
                 ) -> list[dict[str, Any]]:
    """Group values by key (first-seen order) and take the median of each group."""
    groups: dict[tuple[str, str], list[float]] = {}
    extra: dict[tuple[str, str], dict[str, Any]] = {}
    for key, value, info in items:
        groups.setdefault(key, []).append(value)
        extra.setdefault(key, info)
    rows = []
    for key, values in groups.items():
        rows.append({"group": key[0], "name": key[1], "median": statistics.median(values),
                     "values": values, "min": min(values), "max": max(values),
                     **extra[key]})
    return rows


def limits(metrics: list[dict[str, Any]]) -> dict[str, float]:
    """The machine's measured limits, in base units: 'float32 matmul', 'bf16 matmul',
    'memory copy' and, per device, e.g. 'bf16 matmul (cuda)'."""
    out = {}
    for m in metrics:
        if m["group"] == "machine" and m["unit"] in RATE_UNITS:
            out[m["name"]] = m["median"] * RATE_UNITS[m["unit"]][0]
    return out


def limit_for(metric: dict[str, Any], machine: dict[str, float]) -> tuple[str, float] | None:
    """The measured limit a throughput metric is compared with: FLOP rates with the
    matmul rate of their dtype (bf16 if the name says so, else float32) on their device
    (cuda if the name says so, else cpu); byte rates with the copy bandwidth, but only
    those that say they are "memory-bound" (a tokenizer's MB/s of text is no memory
    traffic, and another module's own bandwidth measurement is no use of it)."""
    if metric["group"] == "machine" or metric["unit"] not in RATE_UNITS:
        return None
    kind = RATE_UNITS[metric["unit"]][1]
    text = f"{metric['name']} {metric.get('note', '')}".lower()
    if kind == "bytes" and "memory-bound" not in text:
        return None
    device = "cuda" if "cuda" in text else "cpu"
    if kind == "flops":
        dtype = "bf16" if ("bf16" in text or "bfloat16" in text) else "float32"
        name = f"{dtype} matmul ({device})"
    else:
        name = f"memory copy ({device})"
    return (name, machine[name]) if name in machine else None


def merge(result: Result) -> dict[str, Any]:
    """Medians over rounds, utilisation against the measured limits, errors."""
    metrics = _median_rows([((m.group, m.name), m.value, {"unit": m.unit, "note": m.note})
                            for rep in result.rounds for m in rep.metrics])
    machine = limits(metrics)
    for m in metrics:
        found = limit_for(m, machine)
        if found is not None:
            name, peak = found
            m["utilisation"] = m["median"] * RATE_UNITS[m["unit"]][0] / peak
            m["limit"] = name
    ratios = _median_rows([((r.group, r.name), r.value,
                            {"goal": r.goal, "goal_text": r.goal_text})
                           for rep in result.rounds for r in rep.ratios])
    for r in ratios:
        r["met"] = None if r["goal"] is None else r["median"] >= r["goal"]
    return {"metrics": metrics, "ratios": ratios, "limits": machine,
            "errors": [{k: v for k, v in e.items()} for e in result.errors],
            "module_seconds": result.seconds, "rounds": len(result.rounds)}


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "time_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(), "platform": platform.platform(),
        "processor": platform.processor(), "cpus": os.cpu_count(),
    }
    try:
        env["load_average"] = os.getloadavg()
    except OSError:
        pass
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            env["cuda_device"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    return env


def fmt(x: float) -> str:
    """Four significant figures, without exponent noise for everyday magnitudes."""
    if x == 0 or (1e-3 <= abs(x) < 1e6):
        return f"{x:.4g}"
    return f"{x:.3e}"


def markdown(summary: dict[str, Any]) -> str:
    lines = [f"# Benchmarks ({summary['environment']['time_utc']}, "
             f"{'quick' if summary['quick'] else 'full'}, {summary['rounds']} round(s))", ""]
    env = summary["environment"]
    lines += [f"Machine: {env.get('processor') or env['platform']}, {env['cpus']} CPUs"
              + (f", {env['cuda_device']}" if "cuda_device" in env else ", no CUDA device")
              + (f", load average {env['load_average'][0]:.1f}" if "load_average" in env
                 else "")
              + f"; torch {env.get('torch', '-')}.", ""]
    lines += ["| group | metric | median | unit | min–max | utilisation | note |",
              "| --- | --- | ---: | --- | --- | ---: | --- |"]
    for m in summary["metrics"]:
        util = (f"{100 * m['utilisation']:.1f}% of {m['limit']}" if "utilisation" in m
                else "")
        spread = f"{fmt(m['min'])}–{fmt(m['max'])}" if len(m["values"]) > 1 else ""
        lines.append(f"| {m['group']} | {m['name']} | {fmt(m['median'])} | {m['unit']} | "
                     f"{spread} | {util} | {m['note']} |")
    if summary["ratios"]:
        lines += ["", "Ratios between peers measured in the same round (median over rounds):",
                  "", "| group | ratio | median | goal | met |", "| --- | --- | ---: | --- | --- |"]
        for r in summary["ratios"]:
            met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
            goal = r["goal_text"] or ("" if r["goal"] is None else f"≥ {fmt(r['goal'])}")
            lines.append(f"| {r['group']} | {r['name']} | {fmt(r['median'])} | {goal} | {met} |")
    if summary["errors"]:
        lines += ["", "Benchmarks that failed:", ""]
        lines += [f"- `{e['module']}`: {e['error']}" for e in summary["errors"]]
    lines += ["", "Time per module (all rounds): " + ", ".join(
        f"{k} {v:.0f} s" for k, v in summary["module_seconds"].items()), ""]
    return "\n".join(lines)


def write(summary: dict[str, Any], out: Path) -> tuple[Path, Path]:
    json_path, md_path = out / "bench.json", out / "bench.md"
    write_text(json_path, json.dumps(summary, indent=2, default=str) + "\n",
               make_parents=True)
    write_text(md_path, markdown(summary), make_parents=True)
    return json_path, md_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smaller sizes, fewer repeats, one round (minutes, not hours)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of every benchmark (default 3; 1 with --quick)")
    parser.add_argument("--corpus", default=None,
                        help="text corpus for the tokenizer benchmarks (default: the .py "
                             "files of Python's standard library)")
    parser.add_argument("--out", default=str(ROOT / "out" / "bench"),
                        help="output directory (default out/bench)")
    parser.add_argument("--only", default=None,
                        help="comma-separated modules to run (machine always runs)")
    args = parser.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.corpus is not None and not Path(args.corpus).exists():
        parser.error(f"corpus {args.corpus} does not exist")
    if args.corpus is not None:  # also for modules that read it from the environment
        os.environ["GPTSPEC_CORPUS"] = str(Path(args.corpus).resolve())
    modules = discover()
    if args.only:
        wanted = {"machine", *args.only.split(",")}
        unknown = wanted - {m.name for m in modules}
        if unknown:
            parser.error(f"no benchmark module {sorted(unknown)[0]!r}")
        modules = [m for m in modules if m.name in wanted]
    print(f"[bench] modules: {', '.join(m.name for m in modules)}; {rounds} round(s)")
    result = run_all(modules, rounds, args.quick, args.corpus)
    summary = {"environment": environment(), "quick": args.quick,
               "modules": [m.name for m in modules], **merge(result)}
    json_path, md_path = write(summary, Path(args.out))
    print(md_path.read_text(encoding="utf-8"))
    print(f"[bench] wrote {json_path} and {md_path}")
    return 1 if result.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
