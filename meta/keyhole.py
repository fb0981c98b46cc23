"""The mutation catalog through the keyhole: each forward-area mutant behind a wrapper that
exposes nothing but ``forward``, run through the suite's forward area. Per mutant: is it
still killed, and do the probes (gptspec.conformance.checks_probes.localise) point at the
entry it breaks?

    python -m meta.keyhole [--profile quick] [--jobs 2] [--json FILE] [names ...]

Localised means the mutant's entry is among the entries localise() names first (one
entry, or a tie of a few); the table gives how many were named.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import sys
from dataclasses import asdict, dataclass
from typing import Any

from meta.mutants import BY_NAME, MUTANTS

# the entries of the forward area's mutants that forward alone cannot compute: the
# next-token distribution and a sequence's log-probability are read from logits by the
# caller, not computed by forward
NOT_THROUGH_FORWARD = {"next_token_distribution", "sequence_log_probability"}


class LogitsOnly:
    """A backend seen through the keyhole: its identity and ``forward``, nothing else."""

    protocol_version = 2

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.name = f"{backend.name} (logits only)"
        self.version, self.device, self.dtype = backend.version, backend.device, backend.dtype

    def forward(self, tokens: Any, params: Any, config: Any) -> Any:
        return self._backend.forward(tokens, params, config)


@dataclass
class KeyholeResult:
    name: str
    breaks: list[str]
    killed_by: list[str]  # every failing check
    named: list[str]  # what localise() points at
    killed: bool
    localised: bool
    applicable: bool  # False: forward alone never computes the broken entry


def run_one(name: str, profile: str = "quick", seed: int = 0) -> dict:
    from gptspec.conformance.checks_probes import localise
    from gptspec.conformance.runner import run_suite

    mutant = BY_NAME[name]
    suite = run_suite(LogitsOnly(mutant.backend()), profile=profile, seed=seed, area="forward")
    failing = [r.id for r in suite.results if r.status in ("fail", "error")]
    outcomes = {r.id.removeprefix("probe."): r.status == "pass" for r in suite.results
                if r.id.startswith("probe.") and r.status in ("pass", "fail", "error")}
    named = localise(outcomes)
    applicable = not set(mutant.breaks) <= NOT_THROUGH_FORWARD
    return asdict(KeyholeResult(name, list(mutant.breaks), failing, named, bool(failing),
                                bool(set(named) & set(mutant.breaks)), applicable))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meta.keyhole", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants (default: every forward-area one)")
    parser.add_argument("--profile", default="quick", choices=("quick", "default", "thorough"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", metavar="FILE", help="write the results here")
    args = parser.parse_args(argv)
    names = args.names or [m.name for m in MUTANTS if m.area == "forward"]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown mutant {unknown[0]!r}")
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        results = list(pool.map(run_one, names, [args.profile] * len(names),
                                [args.seed] * len(names)))
    rows = [("mutant", "breaks", "killed", "probes point at", "localised")]
    for r in results:
        rows.append((r["name"], ", ".join(r["breaks"]), "yes" if r["killed"] else "NO",
                     ", ".join(r["named"]) or "-",
                     "n/a" if not r["applicable"] else ("yes" if r["localised"] else "no")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        if i == 0:
            print("| " + " | ".join("-" * w for w in widths) + " |")
    applicable = [r for r in results if r["applicable"]]
    killed = sum(r["killed"] for r in applicable)
    localised = sum(r["localised"] for r in applicable)
    print(f"\n{killed} of {len(applicable)} forward mutants that forward computes are killed "
          f"through the keyhole; {localised} of {len(applicable)} localised to their entry "
          f"(profile {args.profile}, seed {args.seed}); "
          f"{len(results) - len(applicable)} break only what forward does not compute")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"schema": "gptspec-keyhole", "version": 1, "profile": args.profile,
                       "seed": args.seed, "results": results}, f, indent=1)
    return 0 if killed == len(applicable) else 1


if __name__ == "__main__":
    sys.exit(main())
