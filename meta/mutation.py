"""Mutation testing of the suite: run it against every mutant of the catalog
(:mod:`meta.mutants`) and report which check killed each one.

A mutant is *killed* by the first check (in dependency order) that fails or errors on it;
the kill is *on target* when that check names one of the spec entries the mutant breaks.
``python -m meta.mutation`` (what ``nox -s mutants`` runs) prints the table
and exits non-zero if any mutant survives or is killed off target. Mutants run in separate
processes (``--jobs``), each with its own copy of the patched module.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import sys
import time
from dataclasses import asdict, dataclass

from meta.mutants import BY_NAME, MUTANTS, Mutant


@dataclass
class MutantResult:
    name: str
    breaks: list[str]
    killed_by: str  # the first failing check's id; "" when the mutant survived
    check_entries: list[str]
    status: str  # that check's status (fail / error), "survived", or "not-run" (the
    # machine lacks what the mutated code path needs: detail says what)
    on_target: bool
    seconds: float
    detail: str = ""


def _first_kill(mutant: Mutant, profile: str, seed: int) -> tuple[str, list[str], str, str]:
    from gptspec.conformance.runner import run_suite

    suite = run_suite(mutant.backend(), profile=profile, seed=seed, area=mutant.area,
                      stop_on_failure=True)
    for r in suite.results:
        if r.status in ("fail", "error"):
            return r.id, r.entries, r.status, r.detail.splitlines()[0] if r.detail else ""
    return "", [], "survived", ""


def run_mutant(name: str, profile: str = "default", seed: int = 0) -> MutantResult:
    mutant = BY_NAME[name]
    missing = mutant.missing_here()
    if missing:
        return MutantResult(name, list(mutant.breaks), "", [], "not-run", False, 0.0,
                            f"not run: needs {missing}, which this machine lacks")
    start = time.perf_counter()
    check_id, entries, status, detail = _first_kill(mutant, profile, seed)
    return MutantResult(name, list(mutant.breaks), check_id, entries, status,
                        bool(set(entries) & set(mutant.breaks)),
                        time.perf_counter() - start, detail)


def _run_one(args: tuple[str, str, int]) -> dict:
    return asdict(run_mutant(*args))


def run_catalog(names: list[str], profile: str = "default", seed: int = 0, jobs: int = 2,
                on_result=None) -> list[MutantResult]:
    """Run each named mutant, ``jobs`` at a time in fresh ('spawn') processes."""
    results: dict[str, MutantResult] = {}
    if jobs <= 1:
        for n in names:
            results[n] = run_mutant(n, profile, seed)
            if on_result:
                on_result(results[n])
    else:
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
            futures = {pool.submit(_run_one, (n, profile, seed)): n for n in names}
            for future in concurrent.futures.as_completed(futures):
                n = futures[future]
                try:
                    results[n] = MutantResult(**future.result())
                except Exception as err:  # noqa: BLE001 — a worker that died is reported
                    results[n] = MutantResult(n, list(BY_NAME[n].breaks), "", [], "error",
                                              False, 0.0, f"{type(err).__name__}: {err}")
                if on_result:
                    on_result(results[n])
    return [results[n] for n in names]


def table(results: list[MutantResult]) -> str:
    rows = [("mutant", "breaks", "killed by", "names the right entry", "time (s)")]
    for r in results:
        if r.status == "not-run":
            rows.append((r.name, ", ".join(r.breaks), r.detail, "-", "-"))
            continue
        rows.append((r.name, ", ".join(r.breaks), r.killed_by or "SURVIVED",
                     "yes" if r.on_target else "NO", f"{r.seconds:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
             for row in rows]
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(lines)


def write_json(path: str, results: list[MutantResult], profile: str, seed: int,
               started: dict | None = None) -> None:
    """Schema ``gptspec-mutation`` version 1: ``provenance`` as in the conformance report,
    the ``profile`` and ``seed`` the suite ran at, and one entry per mutant (the fields of
    :class:`MutantResult`). ``started``: the provenance taken when the run began (the
    commit that was tested), else it is taken now."""
    import json

    from gptspec.conformance.report import provenance, write_atomically

    data = {"schema": "gptspec-mutation", "version": 1, "provenance": started or provenance(),
            "profile": profile, "seed": seed, "results": [asdict(r) for r in results]}
    write_atomically(path, json.dumps(data, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meta.mutation",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: the whole catalog)")
    parser.add_argument("--profile", default="default", choices=("quick", "default", "thorough"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="processes in parallel (default 2)")
    parser.add_argument("--list", action="store_true", help="list the catalog and exit")
    parser.add_argument("--json", metavar="FILE",
                        help="also write the results as JSON (the spec site's Verification "
                             "page reads docs/mutation-results.json)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be ≥ 1, got {args.jobs}")
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:<36} {m.area:<10} {', '.join(m.breaks):<32} {m.doc}")
        return 0
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        print(f"unknown mutant(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    names = args.names or [m.name for m in MUTANTS]
    from gptspec.conformance.report import provenance

    started = provenance() if args.json else None
    results = run_catalog(names, args.profile, args.seed, args.jobs,
                          on_result=lambda r: print(f"  {r.name}: "
                                                    f"{r.killed_by or r.detail or 'SURVIVED'}",
                                                    flush=True))
    print()
    print(table(results))
    if args.json:
        write_json(args.json, results, args.profile, args.seed, started)
    ran = [r for r in results if r.status != "not-run"]
    bad = [r for r in ran if not r.on_target]
    print(f"\n{len(ran) - len(bad)} of {len(ran)} mutants killed by a check naming "
          f"the right spec entry")
    if len(ran) < len(results):
        print(f"{len(results) - len(ran)} not run: this machine cannot take their code path "
              "(see the table)")
    return 1 if bad or not ran else 0


if __name__ == "__main__":
    sys.exit(main())
