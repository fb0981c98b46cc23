"""The soundness gate: correct backends written differently from the built-in one must
pass every check, in every dtype, at several seeds. A failure here is a false alarm of
the suite (a budget derived wrongly), not a bug of the backend.

    python -m meta.soundness.gate          # every backend × dtype × 3 random seeds, thorough
    python -m meta.soundness.gate --quick  # CI: 1 random seed, float32 and bfloat16, two backends
    python -m meta.soundness.gate --seed 7 # that seed only (repeatable): a reproduction

Seeds are drawn afresh each run (a fixed set lets a budget fit those seeds only) and
printed with the command reproducing a failure; exits 1 on any failure. The compiled
backend recompiles per configuration, so it runs the quick profile.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

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


def run_one(backend: str, dtype: str, seed: int, profile: str, area: str) -> Row:
    start = time.perf_counter()
    suite = run_suite(BACKENDS[backend](dtype=dtype), profile=PROFILE_OF.get(backend, profile),
                      seed=seed, area=None if area == "all" else area, timeout=600)
    return Row(backend, dtype, seed, PROFILE_OF.get(backend, profile), suite,
               time.perf_counter() - start)


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
    args = parser.parse_args(argv)
    backends = args.backend or (list(QUICK_BACKENDS) if args.quick else list(BACKENDS))
    dtypes = args.dtype or (["float32", "bfloat16"] if args.quick
                            else ["float32", "bfloat16", "float16"])
    seeds = choose_seeds(args.seed, args.seeds or (1 if args.quick else 3), args.first_seed)
    profile = args.profile or ("default" if args.quick else "thorough")
    how = "as given" if args.seed or args.first_seed is not None else "drawn at random"
    print(f"seeds {', '.join(map(str, seeds))} ({how}), profile {profile}", flush=True)

    rows, start = [], time.perf_counter()
    for backend in backends:
        for dtype in dtypes:
            for seed in seeds:
                row = run_one(backend, dtype, seed, profile, args.area)
                rows.append(row)
                print(table([row]).splitlines()[1], flush=True)
                for r in row.suite.results:
                    if r.status in ("fail", "error", "blocked"):
                        print(f"    {r.status.upper()} {r.id}: {r.detail}", flush=True)
                if not row.suite.ok:
                    print(f"    reproduce: python -m meta.soundness.gate --backend {backend} "
                          f"--dtype {dtype} --profile {profile} --area {args.area} "
                          f"--seed {seed}", flush=True)
    print()
    print(table(rows))
    bad = [r for r in rows if not r.suite.ok]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} runs passed every check "
          f"in {time.perf_counter() - start:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
