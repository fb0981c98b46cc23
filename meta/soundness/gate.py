"""The soundness gate: correct backends written differently from the built-in one must
pass every check, in every dtype, at several seeds; a failure is a false alarm of the
suite (a budget derived wrongly), not a bug of the backend.

    python -m meta.soundness.gate          # every backend × dtype × 3 random seeds, thorough
    python -m meta.soundness.gate --quick  # CI: 1 random seed, float32 and bfloat16, two backends
    python -m meta.soundness.gate --seed 7 # that seed only (repeatable): a reproduction

Seeds are drawn afresh and printed with the command reproducing a failure; the compiled
backend runs the quick profile. ``--record``/``--ledger`` add up seeds across sittings.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import hashlib
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptspec.conformance.runner import SuiteResult, run_suite


def compiled_torch(device: str = "cpu", dtype: str = "float32"):
    from gptspec.fast.backend import TorchBackend

    backend = TorchBackend(device, dtype, compile=True)
    backend.name = "torch-compiled"
    return backend


def rounded_float64(device: str = "cpu", dtype: str = "float32"):
    from meta.soundness.torch_variants import RoundedFloat64

    return RoundedFloat64(device, dtype)


def explicit_torch(device: str = "cpu", dtype: str = "float32"):
    from meta.soundness.torch_variants import ExplicitTorch

    return ExplicitTorch(device, dtype)


def emulated_numpy(device: str = "cpu", dtype: str = "float32"):
    from meta.soundness.numpy_emulated import EmulatedNumpy

    return EmulatedNumpy(device, dtype)


BACKENDS = {"torch-float64-rounded": rounded_float64, "torch-explicit": explicit_torch,
            "numpy-emulated": emulated_numpy, "torch-compiled": compiled_torch}
QUICK_BACKENDS = ("torch-explicit", "numpy-emulated")
PROFILE_OF = {"torch-compiled": "quick"}  # recompiles per configuration: see the module doc


@dataclass
class Row:
    backend: str
    dtype: str
    seed: int
    profile: str
    suite: SuiteResult
    seconds: float
    code: tuple[str, ...] = ()  # the project's files the run loaded (``loaded_code``)

    @property
    def worst(self) -> float:
        fractions = [r.worst_fraction for r in self.suite.results
                     if r.worst_fraction is not None and r.status in ("pass", "fail")]
        return max(fractions, default=0.0)

    @property
    def worst_check(self) -> str:
        scored = [r for r in self.suite.results
                  if r.worst_fraction is not None and r.status in ("pass", "fail")]
        return max(scored, key=lambda r: r.worst_fraction or 0.0).id if scored else "-"


ROOT = Path(__file__).resolve().parents[2]
FULL_DTYPES = ("float32", "bfloat16", "float16")
# C++ sources the native module compiles: code a run uses without importing it
NATIVE_SOURCES = ("src/gptspec/fast/kernels",)


def loaded_code() -> tuple[str, ...]:
    """What a verdict of the gate depends on, as the run itself loaded it: every module of
    the project imported so far (the judge, the reference, the spec, the backends judged,
    lazy imports included) and, where the native kernels were loaded, their C++ sources;
    paths relative to the checkout."""
    files: set[str] = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path:
            continue
        try:
            relative = Path(path).resolve().relative_to(ROOT)
        except ValueError:  # a library's module
            continue
        if relative.parts[0] in ("src", "meta"):
            files.add(relative.as_posix())
    if "gptspec.fast.native" in sys.modules:
        for folder in NATIVE_SOURCES:
            files.update(p.relative_to(ROOT).as_posix()
                         for p in (ROOT / folder).rglob("*") if p.is_file())
    return tuple(sorted(files))


def judge_identity(code: Sequence[str]) -> str:
    """A short digest of the files ``code`` (as ``loaded_code`` names them; a missing one
    counts as changed) and of the libraries that draw and compute the examples: equal
    identities give equal verdicts for a seed."""
    digest = hashlib.sha256()
    for name in sorted(code):
        digest.update(name.encode() + b"\0")
        try:
            digest.update((ROOT / name).read_bytes() + b"\0")
        except OSError:
            digest.update(b"missing\0")
    import hypothesis
    import numpy
    import scipy
    import torch

    for library in (hypothesis, numpy, scipy, torch):  # scipy: the budgets' erf
        digest.update(f"{library.__name__} {library.__version__}\0".encode())
    return digest.hexdigest()[:16]


def record(path: Path, row: Row, area: str) -> None:
    """Append one run to the ledger, with the code it loaded and that code's identity: one
    line, written with one append (runs in other processes may append beside it)."""
    entry = {"judge": judge_identity(row.code), "code": list(row.code),
             "area": area, "backend": row.backend, "dtype": row.dtype, "seed": row.seed,
             "profile": row.profile, "passed": row.suite.ok, "counts": row.suite.counts,
             "worst": round(row.worst, 6), "worst_check": row.worst_check,
             "failures": [r.id for r in row.suite.results
                          if r.status in ("fail", "error", "blocked")],
             "seconds": round(row.seconds), "when": datetime.datetime.now(
                 datetime.UTC).isoformat(timespec="seconds")}
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def current_runs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs whose code is as it was: every file the run loaded is unchanged (and the
    libraries too). A change elsewhere (the command line, the training loop) keeps them."""
    identities: dict[tuple[str, ...], str] = {}

    def now(code: tuple[str, ...]) -> str:
        if code not in identities:
            identities[code] = judge_identity(code)
        return identities[code]

    return [e for e in entries if isinstance(e.get("code"), list) and e["code"]
            and now(tuple(e["code"])) == e["judge"]]


def ledger_summary(path: Path) -> tuple[str, int, int]:
    """(text, seeds whose every backend × dtype passed at its full profile, failed runs)
    over the runs whose code is unchanged (``current_runs``)."""
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    mine = current_runs(entries)
    full = {(b, d) for b in BACKENDS for d in FULL_DTYPES}
    by_seed: dict[int, set[tuple[str, str]]] = {}
    failed = [e for e in mine if not e["passed"]]
    for e in mine:
        if (e["passed"] and e["area"] == "all"
                and e["profile"] == PROFILE_OF.get(e["backend"], "thorough")):
            by_seed.setdefault(e["seed"], set()).add((e["backend"], e["dtype"]))
    complete = sorted(seed for seed, runs in by_seed.items() if runs >= full)
    partial = {seed: len(runs) for seed, runs in by_seed.items() if not runs >= full}
    worst = max(mine, key=lambda e: e["worst"], default=None)
    lines = [f"{len(mine)} runs on the code as it is now ({len(entries) - len(mine)} on "
             "code changed since, not counted)",
             f"seeds that passed every backend × dtype ({len(full)} runs each): "
             f"{len(complete)}{': ' + ', '.join(map(str, complete)) if complete else ''}"]
    if partial:
        lines.append("seeds begun: " + ", ".join(f"{s} ({n} of {len(full)})"
                                                  for s, n in sorted(partial.items())))
    if worst is not None:
        lines.append(f"worst fraction of budget: {100 * worst['worst']:.3g}% "
                     f"({worst['worst_check']}, {worst['backend']} {worst['dtype']}, "
                     f"seed {worst['seed']})")
    for e in failed:
        lines.append(f"FAILED {e['backend']} {e['dtype']} seed {e['seed']} ({e['profile']}): "
                     + ", ".join(e["failures"]))
    return "\n".join(lines), len(complete), len(failed)


def _one_thread_each() -> None:
    import torch

    torch.set_num_threads(1)


def run_one(backend: str, dtype: str, seed: int, profile: str, area: str,
            timeout: float = 600) -> Row:
    start = time.perf_counter()
    suite = run_suite(BACKENDS[backend](dtype=dtype), profile=PROFILE_OF.get(backend, profile),
                      seed=seed, area=None if area == "all" else area, timeout=timeout or None)
    return Row(backend, dtype, seed, PROFILE_OF.get(backend, profile), suite,
               time.perf_counter() - start, loaded_code())


def table(rows: list[Row]) -> str:
    lines = [f"{'backend':<22} {'dtype':<9} {'seed':>4} {'profile':<9} {'pass':>4} {'fail':>4} "
             f"{'n/i':>4} {'worst':>9}  {'worst check':<36} {'time':>7}"]
    for r in rows:
        c = r.suite.counts
        failed = c["fail"] + c["error"] + c["blocked"]
        lines.append(f"{r.backend:<22} {r.dtype:<9} {r.seed:>4} {r.profile:<9} {c['pass']:>4} "
                     f"{failed:>4} {c['not-implemented']:>4} {100 * r.worst:>8.3g}%  "
                     f"{r.worst_check:<36} {r.seconds:>6.0f}s")
    return "\n".join(lines)


SEED_RANGE = 2**31  # the conformance runner's seeds are any non-negative int


def choose_seeds(given: list[int] | None, count: int, first: int | None) -> list[int]:
    """The seeds given, else ``count`` consecutive ones from ``first``, else ``count``
    distinct seeds drawn from os.urandom (a fresh draw each run)."""
    if given:
        return list(dict.fromkeys(given))
    if first is not None:
        return list(range(first, first + count))
    seeds: list[int] = []
    while len(seeds) < count:
        seed = int.from_bytes(os.urandom(4), "little") % SEED_RANGE
        if seed not in seeds:
            seeds.append(seed)
    return seeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="1 seed, default profile, float32 and bfloat16, two backends")
    parser.add_argument("--backend", action="append", choices=sorted(BACKENDS))
    parser.add_argument("--dtype", action="append",
                        choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--seed", type=int, action="append",
                        help="run this seed (repeatable) instead of drawing seeds")
    parser.add_argument("--seeds", type=int, default=None,
                        help="how many seeds (default 3, 1 with --quick)")
    parser.add_argument("--first-seed", type=int, default=None,
                        help="consecutive seeds from this one instead of random ones")
    parser.add_argument("--profile", default=None, choices=("quick", "default", "thorough"))
    parser.add_argument("--area", default="all")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs at once, in processes of one thread each")
    parser.add_argument("--timeout", type=float, default=600, metavar="SECONDS",
                        help="time limit per check (default 600; 0 for none: on a machine "
                             "busy with other work a thorough check can take longer, and "
                             "a timed-out check is an error that leaves its seed unjudged)")
    parser.add_argument("--record", type=Path, default=None, metavar="LEDGER",
                        help="append each run to this ledger (JSON lines)")
    parser.add_argument("--ledger", type=Path, default=None,
                        help="run nothing: count the seeds this ledger shows passed on the "
                             "code as it is now; exits 1 if any such run failed")
    args = parser.parse_args(argv)
    if args.ledger is not None:
        text, _, failed = ledger_summary(args.ledger)
        print(text)
        return 1 if failed else 0
    backends = args.backend or (list(QUICK_BACKENDS) if args.quick else list(BACKENDS))
    dtypes = args.dtype or (["float32", "bfloat16"] if args.quick
                            else ["float32", "bfloat16", "float16"])
    seeds = choose_seeds(args.seed, args.seeds or (1 if args.quick else 3), args.first_seed)
    profile = args.profile or ("default" if args.quick else "thorough")
    how = "as given" if args.seed or args.first_seed is not None else "drawn at random"
    print(f"seeds {', '.join(map(str, seeds))} ({how}), profile {profile}", flush=True)

    rows, start = [], time.perf_counter()
    if not 0 <= args.timeout < float("inf"):
        parser.error(f"--timeout must be a number of seconds ≥ 0, got {args.timeout}")
    work = [(backend, dtype, seed, profile, args.area, args.timeout)
            for backend in backends for dtype in dtypes for seed in seeds]

    def report(row: Row) -> None:
        rows.append(row)
        if args.record is not None:
            record(args.record, row, args.area)
        print(table([row]).splitlines()[1], flush=True)
        for r in row.suite.results:
            if r.status in ("fail", "error", "blocked"):
                print(f"    {r.status.upper()} {r.id}: {r.detail}", flush=True)
        if not row.suite.ok:
            print(f"    reproduce: python -m meta.soundness.gate --backend {row.backend} "
                  f"--dtype {row.dtype} --profile {profile} --area {args.area} "
                  f"--seed {row.seed}", flush=True)

    if args.jobs > 1:
        with concurrent.futures.ProcessPoolExecutor(
                args.jobs, mp_context=multiprocessing.get_context("spawn"),
                initializer=_one_thread_each) as pool:
            for future in concurrent.futures.as_completed(
                    [pool.submit(run_one, *job) for job in work]):
                report(future.result())
    else:
        for job in work:
            report(run_one(*job))
    print()
    print(table(rows))
    bad = [r for r in rows if not r.suite.ok]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} runs passed every check "
          f"in {time.perf_counter() - start:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
