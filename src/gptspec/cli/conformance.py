"""``gptspec conformance``: validate a backend against the float64 reference.

With no ``--backend`` it validates the built-in PyTorch backend on the CPU in float32
and float64, and, when a CUDA device is present, on it in float32, bfloat16 and float16.
(The same backend with a fused attention kernel forced is test tooling, not product:
``meta/sdpa_kernels.py`` in the repository, which ``benchmarks/cuda_check.sh`` runs.)

A backend given with ``--backend`` runs isolated by default: its checks run in a worker
process, with a per-check time limit, so that a hang or a crash is reported and the run
goes on (``--no-isolate`` runs it in this process).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gptspec.cli import CLIError, arguments, standard_stream, writing_stdout
from gptspec.cli.in_process import InProcessGuard

MAX_TIMEOUT = 86400.0  # seconds per check: a day; more is a typo (and past what poll takes)
MIN_TIMEOUT = 0.001
EXIT_STATUSES = ("exit status: 0 when every check judged passed (a check not implemented or not "
                 "applicable, or a run the backend refused, is no failure); 1 when a check "
                 "failed, erred or was blocked, or on an unexpected error; 2 for a usage error, "
                 "a backend that cannot be loaded or started, or nothing judged (the backend "
                 "refused every run asked, or every check was not implemented or not "
                 "applicable); 130, 143 or 129 when stopped by Ctrl-C, SIGTERM or "
                 "SIGHUP")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", action="append", metavar="MODULE:ATTR",
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
    parser.add_argument("--area", default="all",
                        help="which part of the suite: forward, tokenizer, training, "
                             "generation, or all (default all: what a backend does not "
                             "bring is reported as not implemented)")
    parser.add_argument("--report", metavar="FILE", help="write the JSON report here")
    parser.add_argument("--markdown", metavar="FILE", help="write a Markdown summary here")
    parser.add_argument("--save-failures", metavar="DIR",
                        help="save each failing example here: its exact inputs (.npz) and a "
                             "pytest file that replays it without Hypothesis")
    parser.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                        help="run the checks in a worker process that a hang or crash cannot "
                             "take down (default: on for --backend, off for the built-in)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                        help=f"time limit per check, for starting the backend and, with "
                             "--no-isolate, for its exit handlers (default "
                             f"300, at most {MAX_TIMEOUT:g}: a day; 0 for none); with "
                             "--no-isolate a check that the timer cannot stop ends the "
                             "whole run a tenth of the limit later (at least 5 s), unless "
                             "compiled code holds Python's interpreter lock")
    parser.add_argument("--adjudicate-with", default="torch", metavar="MODULE:ATTR",
                        help="the plain backend a low-precision failure is compared with, "
                             "on the CPU in the same dtype (default: the built-in torch; "
                             "none: no adjudication)")
    parser.add_argument("--list-checks", action="store_true", help="list the checks and exit")
    parser.add_argument("--list-backends", action="store_true",
                        help="list the installed backends and exit")
    parser.epilog = EXIT_STATUSES


def _cuda_targets() -> list[tuple[str, str | None, str | None]]:
    """The built-in backend on CUDA in every dtype, with PyTorch's own kernel choice."""
    return [("torch", "cuda", dt) for dt in ("float32", "bfloat16", "float16")]


def _targets(args: argparse.Namespace) -> list[tuple[str, str | None, str | None]]:
    if not args.backend and not args.device and not args.dtype:
        return ([("torch", "cpu", "float32"), ("torch", "cpu", "float64")]
                + (_cuda_targets() if _cuda() else []))
    backends = args.backend or ["torch"]
    if args.device:
        devices = args.device
    elif args.backend:
        devices = [None]
    else:
        devices = ["cpu"] + (["cuda"] if _cuda() else [])
    targets = []
    for target in backends:
        for device in devices:
            if args.dtype:
                dtypes: list[str | None] = list(args.dtype)
            elif args.backend:
                dtypes = [None]  # the backend's own
            else:
                dtypes = (["float32", "float64"] if device != "cuda"
                          else ["float32", "bfloat16", "float16"])
            for dtype in dtypes:
                targets.append((target, device, dtype))
    return targets


def _locate_backends(args: argparse.Namespace) -> dict[str, Path | None]:
    """Every backend module the command line names exists, before any check runs: a typo
    in --adjudicate-with would otherwise surface only as a note on the first failure.
    Returns their files, which no output may replace."""
    from gptspec.conformance.discovery import BackendError, locate

    given = [("--backend", target) for target in args.backend or []]
    if args.adjudicate_with not in ("none", "torch"):  # torch: the built-in, this package's
        given.append(("--adjudicate-with", args.adjudicate_with))
    files: dict[str, Path | None] = {}
    for flag, target in given:
        try:
            origin = locate(target)
        except BackendError as err:
            raise CLIError(f"{flag} {target}: {err}") from None
        files[f"{flag} {target}"] = Path(origin) if origin else None
    return files


def _only_list_flags(args: argparse.Namespace) -> None:
    """--list-checks (narrowed by --check and --area) and --list-backends print a list and
    run nothing: a flag of a run beside them would be ignored without a word."""
    if args.list_checks and args.list_backends:
        raise CLIError("--list-checks and --list-backends: give one of them")
    mode = "--list-checks" if args.list_checks else "--list-backends"
    run_only = {"--backend": args.backend, "--device": args.device, "--dtype": args.dtype,
                "--report": args.report, "--markdown": args.markdown,
                "--save-failures": args.save_failures, "--isolate/--no-isolate": args.isolate,
                # given other than their defaults
                "--profile": None if args.profile == "default" else 1,
                "--seed": None if args.seed == 0 else 1,
                "--timeout": None if args.timeout == 300.0 else 1,
                "--adjudicate-with": None if args.adjudicate_with == "torch" else 1}
    if args.list_backends:
        run_only.update({"--check": args.check, "--area": None if args.area == "all" else 1})
    for flag, value in run_only.items():
        if value is not None:
            raise CLIError(f"{flag} is not used with {mode}, which prints a list and runs "
                           "no check")


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def run(args: argparse.Namespace) -> int:
    from gptspec.conformance import report
    from gptspec.conformance.context import cache_outside_the_working_directory

    cache_outside_the_working_directory()
    from gptspec.conformance.discovery import registered
    from gptspec.conformance.registry import all_checks

    if args.list_backends or args.list_checks:
        _only_list_flags(args)
        standard_stream("stdout", "the list is printed there")
    else:
        standard_stream("stdout", "the checks' verdicts are printed there")
    if args.list_backends:
        with writing_stdout():
            for name, target in sorted(registered().items()):
                print(f"{name:<16} {target}")
        return 0
    area = None if args.area == "all" else args.area
    if area is not None and not all_checks(area):
        raise CLIError(f"no checks in area {args.area!r}")
    if args.check and "" in args.check:  # it would match every check (a prefix of all)
        raise CLIError("--check: the pattern is empty (omit --check to run every check)")
    for name in args.device or ():  # checked whoever names the device: none of these is one
        arguments.device_name(name)

    def selected(check) -> bool:
        return not args.check or any(fnmatch.fnmatch(check.id, p) or check.id.startswith(p)
                                     for p in args.check)

    # each pattern on its own: a mistyped one beside one that matches was dropped silently
    ids = [c.id for c in all_checks(area)]
    for pattern in args.check or ():
        if not any(fnmatch.fnmatch(i, pattern) or i.startswith(pattern) for i in ids):
            raise CLIError(f"--check {pattern} matches no check"
                           f"{'' if area is None else f' in area {args.area!r}'} "
                           "(gptspec conformance --list-checks lists them)")
    if args.list_checks:
        with writing_stdout():
            for c in filter(selected, all_checks(area)):
                print(f"{c.id:<44} {c.kind:<12} {', '.join(c.entries)}")
        return 0
    arguments.finite(args.timeout, "--timeout (seconds; 0 for none)", low=0, high=MAX_TIMEOUT)
    if 0 < args.timeout < MIN_TIMEOUT:  # a timer this short is rounded to none at all
        raise CLIError(f"--timeout must be 0 (none) or at least {MIN_TIMEOUT:g} s, "
                       f"got {args.timeout:g}")
    arguments.seed(args.seed)
    backend_files = _locate_backends(args)
    for flag, path in (("--report", args.report), ("--markdown", args.markdown)):
        if path is not None:
            arguments.output_file(path, flag)
            arguments.not_an_input(Path(path), flag, backend_files)
    if args.report is not None and args.markdown is not None and (
            Path(args.report).absolute() == Path(args.markdown).absolute() or
            arguments.same_file(Path(args.report), Path(args.markdown))):
        raise CLIError(f"--report and --markdown name the same file ({args.report}); the "
                       "second would replace the first")
    if args.save_failures is not None:
        folder = arguments.output_dir(args.save_failures, "--save-failures")
        for flag, path in (("--report", args.report), ("--markdown", args.markdown)):
            # a saved failure is <backend>_<dtype>_<check>.npz and test_<same>.py: a report
            # under such a name there would replace the failure it reproduces
            p = Path(path) if path is not None else None
            if p is not None and p.parent.resolve() == folder.resolve() and (
                    p.suffix == ".npz" or (p.name.startswith("test_") and p.suffix == ".py")):
                raise CLIError(f"{flag} {path} is in the --save-failures folder under a name "
                               "a saved failure takes (*.npz, test_*.py); choose another name")
    # absolute now: a backend run in this process (--no-isolate) may change the working
    # directory, and the files must land where they were asked for
    for name in ("report", "markdown", "save_failures"):
        if getattr(args, name) is not None:
            setattr(args, name, str(Path(getattr(args, name)).absolute()))
    if args.device and not args.backend:  # another backend's device names are its own
        for device in args.device:
            arguments.device(device)
    timeout = args.timeout or None
    isolate = bool(args.backend) if args.isolate is None else args.isolate
    suites: list = []
    current: list = []  # the run in progress, as its header saw it
    started = report.provenance()  # the code that runs is the code imported now

    def with_the_run_in_progress() -> None:
        if current and current[0] not in suites:  # reported with the checks it finished
            current[0].settings["interrupted"] = True
            suites.append(current[0])

    def write_reports() -> None:
        for flag, path, write in (
                ("--report", args.report, lambda p: report.write_json(p, suites, started)),
                ("--markdown", args.markdown,
                 lambda p: report.write_atomically(p, report.to_markdown(suites)))):
            if path:
                try:
                    write(path)
                except OSError as err:  # a full disk: the temporary file is removed
                    raise CLIError(f"{flag}: cannot write {path}: {err.strerror or err}"
                                   ) from None

    def past_the_limit(waited: float) -> None:  # the watchdog's thread; the process ends
        from gptspec.conformance.runner import stop_relaying

        stop_relaying()  # the judge's own output back, for the lines below
        print(f"gptspec conformance: error: the backend has not returned for {waited:.0f} s, "
              f"past --timeout {timeout:g} s, and the timer could not stop it in this process "
              "(--no-isolate); the run ends here, the reports hold the checks that finished",
              file=sys.stderr, flush=True)
        with_the_run_in_progress()
        try:
            write_reports()
        except CLIError as err:
            print(f"gptspec conformance: error: {err}", file=sys.stderr)

    if isolate:
        return _run_all(args, area, selected, timeout, isolate, suites, current,
                        with_the_run_in_progress, write_reports, None)
    from gptspec.conformance.runner import end_routing, route_backend_output

    # the backend's output goes aside, and is relayed escaped, for the whole run: a
    # thread it leaves running wrote raw between the verdict lines and after the summary
    route_backend_output()
    guard = InProcessGuard(timeout, past_the_limit)
    try:
        return _run_all(args, area, selected, timeout, isolate, suites, current,
                        with_the_run_in_progress, write_reports, guard)
    except BaseException:  # Ctrl-C, SIGTERM, an error: reported by main, which then ends
        # the process without waiting for the threads the backend left
        from gptspec import cli

        cli.ABANDONED_THREADS.extend(guard.stray_threads())
        raise
    finally:
        end_routing(keep_aside=guard.left_running())


def _run_all(args: argparse.Namespace, area: str | None, selected, timeout: float | None,
             isolate: bool, suites: list, current: list,
             with_the_run_in_progress: Callable[[], None], write_reports: Callable[[], None],
             guard: InProcessGuard | None) -> int:
    from gptspec.conformance.protocol import shown

    try:
        with writing_stdout(), guard or contextlib.nullcontext():
            for target, device, dtype in _targets(args):
                current.clear()
                suites.append(_run_one(args, target, device, dtype, area, selected, timeout,
                                       isolate, current.append, guard))
    except KeyboardInterrupt:
        with_the_run_in_progress()  # Ctrl-C or SIGTERM
        raise
    finally:
        # whatever happened (a backend that cannot be built, Ctrl-C), the runs that
        # finished are reported
        write_reports()
    failed = [s for s in suites if not s.ok]
    if failed:
        print(f"\nconformance: {len(failed)} of {len(suites)} runs failed", file=sys.stderr)
    # every run refused by its backend, or every check not implemented or not applicable:
    # nothing was judged, which is no pass (status 2, as a device that is not here: what
    # was asked cannot be judged); the reports say so too
    nothing = not any(s.judged for s in suites)
    status = 2 if nothing else 1 if failed else 0
    if guard:  # what the backend's exit handlers print is relayed, as its checks' output
        from gptspec.conformance.runner import backend_output_relayed, end_routing, stop_relaying

        with backend_output_relayed():
            guard.run_exit_handlers(status, before_exit=stop_relaying)
    stray = guard.stray_threads() if guard else []
    if stray:  # Python would wait for them at exit, forever if they never end: main ends
        # the process without waiting, as after a stop
        from gptspec import cli

        end_routing(keep_aside=True)  # what they printed so far, relayed; the rest: nowhere
        more = ", …" if len(stray) > 1 else ""
        print(f"gptspec conformance: warning: the backend left {len(stray)} thread(s) running "
              f"({shown(stray[0].name)}{more}); the process ends without waiting for them",
              file=sys.stderr)
        cli.ABANDONED_THREADS.extend(stray)
    if nothing:
        raise CLIError(_nothing_judged(suites))
    return status


def _nothing_judged(suites: list) -> str:
    """The line of a command none of whose runs reached a verdict: every run refused, or
    every check asked not implemented or not applicable."""
    who = "the backend" if len({s.backend["name"] for s in suites}) == 1 else "the backends"
    if all(s.refused for s in suites):
        first = suites[0]
        more = f"; and {len(suites) - 1} more" if len(suites) > 1 else ""
        return (f"nothing was judged: {who} refused every run asked ({first.backend['dtype']} "
                f"on {first.backend['device']}: {first.refused}{more})")
    results = [r for s in suites for r in s.results]
    if not results:
        return "nothing was judged: no check was selected"
    first = results[0]
    return (f"nothing was judged: {who} implements none of the {len(results)} checks asked, "
            f"or cannot express them (e.g. {first.id}: {first.detail})")


def _run_one(args: argparse.Namespace, target: str, device: str | None, dtype: str | None,
             area: str | None, selected, timeout: float | None, isolate: bool,
             started: Callable[[Any], None], guard: InProcessGuard | None = None):
    from gptspec.conformance import report
    from gptspec.conformance.discovery import BackendError, BackendRefused
    from gptspec.conformance.isolation import run_isolated
    from gptspec.conformance.protocol import shown
    from gptspec.conformance.runner import (
        SuiteResult,
        backend_output_relayed,
        reproduce_command,
        run_suite,
        start_backend,
        suite_settings_dict,
    )

    print()
    common = dict(profile=args.profile, seed=args.seed, select=selected, area=area,
                  reproduce=reproduce_command(target, args.profile, args.area, dtype, device),
                  timeout=timeout,
                  save_failures=args.save_failures,
                  plain=None if args.adjudicate_with == "none" else args.adjudicate_with,
                  on_result=lambda r: _result(r, guard),
                  header=lambda s: _announce(s, started, guard))
    try:
        if isolate:
            suite = run_isolated(target, device=device, dtype=dtype, **common)
        else:
            # bounded like a check: the timer interrupts Python code; the worker process
            # bounds the rest (--isolate)
            with backend_output_relayed():  # its prints, escaped: as the worker's are
                backend, origin = start_backend(target, device=device, dtype=dtype,
                                                timeout=timeout)
            suite = run_suite(backend, origin=origin, dtype=dtype, device=device,
                              relay_output=True, **common)
    except BackendRefused as err:
        # the backend declines this dtype or device: recorded with its reason, and the
        # other runs go on
        suite = SuiteResult({"name": shown(target), "version": "",
                             "device": shown(device or "its default device"),
                             "dtype": dtype or "its default dtype"},
                            suite_settings_dict(args.profile, args.seed, area, timeout,
                                                isolated=isolate),
                            refused=err.reason)
        started(suite)
        print(report.header(suite), flush=True)
    except BackendError as err:
        raise CLIError(str(err)) from None
    print(report.summary(suite), flush=True)
    return suite


def _announce(suite: Any, started: Callable[[Any], None],
              guard: InProcessGuard | None = None) -> None:
    """A run begins: the caller keeps it (to report its finished checks if the command is
    stopped), and its header is printed."""
    from gptspec.conformance import report

    started(suite)
    print(report.header(suite), flush=True)
    if guard:  # the backend is built: its first check begins
        guard.progress()


def _result(result: Any, guard: InProcessGuard | None) -> None:
    from gptspec.conformance import report
    from gptspec.conformance.protocol import shown

    code = guard.take_exit() if guard else None
    if code is not None and result.status not in ("fail", "error"):
        # os._exit where Python swallowed its SystemExit (a finalizer): isolated, the
        # worker would have ended, an error; so here
        result.status, result.worst_fraction = "error", None
        result.detail = (f"the backend called os._exit({shown(code)}) in the judge's process "
                         "(--no-isolate), where Python ignored it (a finalizer)")
    print(report.line(result), flush=True)
    if guard:
        guard.progress()
