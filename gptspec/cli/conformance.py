"""``gptspec conformance``: validate a backend against the float64 reference.

With no ``--backend`` it validates the built-in PyTorch backend on the CPU in float32
and float64, and on CUDA (float32 and bfloat16) when a device is present.
"""

from __future__ import annotations

import argparse
import fnmatch
import shlex
import sys

from gptspec.cli import CLIError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", action="append", metavar="SPEC",
                        help="module:attr or an installed backend name (repeatable); "
                             "default: the built-in torch backend")
    parser.add_argument("--device", action="append", metavar="DEVICE",
                        help="device(s) to run on (repeatable); default cpu, and cuda if present")
    parser.add_argument("--dtype", action="append", metavar="DTYPE",
                        choices=("float64", "float32", "bfloat16", "float16"),
                        help="dtype(s) to run in (repeatable); default float32 and float64")
    parser.add_argument("--profile", default="default", choices=("quick", "default", "thorough"),
                        help="how many Hypothesis examples per property (12 / 30 / 200)")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis seed (default 0)")
    parser.add_argument("--check", action="append", metavar="PATTERN",
                        help="run only checks whose id matches (glob, repeatable)")
    parser.add_argument("--area", default="forward",
                        help="which part of the suite: forward, tokenizer, training, "
                             "generation, or all (default forward)")
    parser.add_argument("--report", metavar="FILE", help="write the JSON report here")
    parser.add_argument("--markdown", metavar="FILE", help="write a Markdown summary here")
    parser.add_argument("--list-checks", action="store_true", help="list the checks and exit")
    parser.add_argument("--list-backends", action="store_true",
                        help="list the installed backends and exit")


def _targets(args: argparse.Namespace) -> list[tuple[str, str | None, str | None]]:
    backends = args.backend or ["torch"]
    if args.device:
        devices = args.device
    elif args.backend:
        devices = [None]
    else:
        devices = ["cpu"] + (["cuda"] if _cuda() else [])
    targets = []
    for spec in backends:
        for device in devices:
            if args.dtype:
                dtypes: list[str | None] = list(args.dtype)
            elif args.backend:
                dtypes = [None]  # the backend's own
            else:
                dtypes = ["float32", "float64"] if device != "cuda" else ["float32", "bfloat16"]
            for dtype in dtypes:
                targets.append((spec, device, dtype))
    return targets


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def run(args: argparse.Namespace) -> int:
    from gptspec.conformance import report
    from gptspec.conformance.discovery import BackendError, load_backend, registered
    from gptspec.conformance.registry import all_checks
    from gptspec.conformance.runner import run_suite

    if args.list_backends:
        for name, target in sorted(registered().items()):
            print(f"{name:<16} {target}")
        return 0
    area = None if args.area == "all" else args.area
    if args.list_checks:
        for c in all_checks(area):
            print(f"{c.id:<44} {c.kind:<12} {', '.join(c.entries)}")
        return 0
    if area is not None and not all_checks(area):
        raise CLIError(f"no checks in area {args.area!r}")

    def selected(check) -> bool:
        return not args.check or any(fnmatch.fnmatch(check.id, p) or check.id.startswith(p)
                                     for p in args.check)

    suites = []
    for spec, device, dtype in _targets(args):
        try:
            backend = load_backend(spec, device=device, dtype=dtype)
        except BackendError as err:
            raise CLIError(str(err)) from None
        repro = ["gptspec", "conformance", "--backend", spec, "--dtype", dtype,
                 "--profile", args.profile, "--area", args.area]
        if device:
            repro += ["--device", device]
        print()
        suite = run_suite(backend, profile=args.profile, seed=args.seed, select=selected,
                          area=area, reproduce=shlex.join(repro),
                          on_result=lambda r: print(report.line(r), flush=True),
                          header=lambda s: print(report.header(s), flush=True))
        print(report.summary(suite), flush=True)
        suites.append(suite)
    if args.report:
        report.write_json(args.report, suites)
    if args.markdown:
        report.write_atomically(args.markdown, report.to_markdown(suites))
    failed = [s for s in suites if not s.ok]
    if failed:
        print(f"\nconformance: {len(failed)} of {len(suites)} runs failed", file=sys.stderr)
        return 1
    return 0
