"""Sessions: tests, conformance, lint, docs, bench, mutants, keyhole, wheel, soundness, ecosystem,
experiments, judge_without_torch (not by default).

Every session but judge_without_torch installs torch 2.13.0 (the CPU wheel in /opt/wheels
on the project's machines) with the package's ``torch`` extra; all install the versions in
constraints.txt.
"""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests", "conformance", "wheel"]
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).parent
WHEELS = Path("/opt/wheels")
PYTHON = "3.11"


def pip_args() -> list[str]:
    args = ["-c", str(ROOT / "constraints.txt")]
    if WHEELS.is_dir():
        args += ["--find-links", str(WHEELS)]
    return args


def install(session: nox.Session, extras: str = "", torch: bool = True) -> None:
    """The package, editable, with ``extras`` (comma-separated) and, unless ``torch`` is
    False, the ``torch`` extra (the fast backend; torch is not a core dependency)."""
    wanted = [e for e in extras.split(",") if e]
    if torch:
        session.install(*pip_args(), "torch==2.13.0")  # first: the CPU wheel, not CUDA's
        wanted = ["torch", *wanted]
    target = f".[{','.join(wanted)}]" if wanted else "."
    session.install(*pip_args(), "-e", target)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The project's own tests: spec ↔ reference, traceability, every component."""
    install(session, "interop,docs,jax,onnx,independent,pytest")  # pytest: xdist, for -n
    # every core by default (about half the time on two); "-- -n 0" for one process
    session.run("pytest", "tests", "-n", "auto", *session.posargs)


@nox.session(python=PYTHON)
def conformance(session: nox.Session) -> None:
    """Validate the built-in PyTorch backend (or --backend module:attr) against the reference."""
    install(session)
    session.run("gptspec", "conformance", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff over everything, mypy over the package (with the adapters' engines installed, so
    their types are checked rather than read as Any)."""
    install(session, "dev,jax,interop,independent")
    session.run("ruff", "check", ".")
    session.run("mypy", "src/gptspec")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Every benchmark, several rounds: medians, ratios and utilisation into out/bench
    (bench.json, bench.md). Options after --: --quick, --corpus PATH, --out DIR."""
    install(session, "interop")
    session.run("python", "-m", "benchmarks.run", *session.posargs)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the spec site with --strict into site/ (`nox -s docs -- serve` serves it).

    KaTeX is installed from the npm registry into .cache/katex on the first build; after
    that the build needs no network. With no conformance report in out/conformance/, quick
    conformance runs write them first, in all four dtypes (delete them to refresh)."""
    install(session, "docs")
    session.env["NO_MKDOCS_2_WARNING"] = "1"  # Material's banner about its successor
    reports = ROOT / "out" / "conformance"
    if not any(reports.glob("*.json")):  # the pages show the built-in backends' results
        reports.mkdir(parents=True, exist_ok=True)
        session.run("gptspec", "conformance", "--profile", "quick", "--area", "all", "--report",
                    str(reports / "builtin.json"), success_codes=[0, 1])
        # bfloat16 and float16: the forward and generation checks, what a 16-bit backend
        # promises (training runs in float32 or float64)
        for area in ("forward", "generation"):
            session.run("gptspec", "conformance", "--profile", "quick", "--area", area,
                        "--dtype", "bfloat16", "--dtype", "float16", "--report",
                        str(reports / f"builtin-16bit-{area}.json"), success_codes=[0, 1])
    if session.posargs[:1] == ["serve"]:
        session.run("mkdocs", "serve", "--dev-addr", "127.0.0.1:8000", *session.posargs[1:])
    else:
        session.run("mkdocs", "build", "--strict", *session.posargs)


@nox.session(python=PYTHON)
def wheel(session: nox.Session) -> None:
    """Build a plain wheel and check it installs and works outside the source tree."""
    tmp = Path(session.create_tmp()).resolve()
    for old in tmp.glob("gptspec-*.whl"):
        old.unlink()
    session.install(*pip_args(), "torch==2.13.0")
    session.run("python", "-m", "pip", "wheel", "--no-deps", "-w", str(tmp), str(ROOT))
    (built,) = tmp.glob("gptspec-*.whl")
    session.install(*pip_args(), "--force-reinstall", "--no-deps", str(built))
    session.install(*pip_args(), f"gptspec[torch] @ {built.as_uri()}")  # + ninja, for the kernel
    session.chdir(tmp)  # away from the source folders, so only the wheel can be imported
    session.run("python", "-c", (
        "import gptspec, gptspec.spec, gptspec.reference, gptspec.fast.model, "
        "gptspec.conformance, gptspec.cli; "
        "assert 'site-packages' in gptspec.spec.__file__, gptspec.spec.__file__; "
        "print('wheel imports from', gptspec.__file__)"))
    session.run("gptspec", "info", "gpt2")
    session.run("python", "-c", (  # the kernel's source ships in the wheel and builds from it
        "from pathlib import Path; from gptspec.fast import bf16_gemv; "
        "flags = Path('/proc/cpuinfo').read_text() if Path('/proc/cpuinfo').exists() else ''; "
        "assert bf16_gemv.available() == ('avx512_bf16' in flags.split()); "
        "print('bf16 GEMV kernel available:', bf16_gemv.available())"))
    session.run("gptspec", "conformance", "--backend", "reference", "--profile", "quick")
    session.run("gptspec", "conformance", "--dtype", "float32", "--profile", "quick")


@nox.session(python=PYTHON)
def mutants(session: nox.Session) -> None:
    """Run the suite (default profile) against every planted-bug mutant of the fast backend
    and print the table mutant → killing check (options after --: names, --jobs N,
    --profile P; --json docs/mutation-results.json saves it for the site's Verification page)."""
    install(session)
    session.run("python", "-m", "meta.mutation", *session.posargs)


@nox.session(python=PYTHON)
def keyhole(session: nox.Session) -> None:
    """The forward-area mutants behind a wrapper that exposes only forward: which are still
    killed and where the probes point (options after --: names, --profile, --jobs; the
    default saves docs/keyhole-results.json for the site's Verification page)."""
    install(session)
    session.run("python", "-m", "meta.keyhole", *(session.posargs or
                                                  ["--json", "docs/keyhole-results.json"]))


@nox.session(python=PYTHON)
def judge_without_torch(session: nox.Session) -> None:
    """A backend author's environment: the package and its JAX extra in a fresh venv with
    no torch (and nothing to compile); the judge imports, then validates the JAX backend
    (quick profile) in float32 and, for the forward checks, bfloat16; the import-guard
    tests run there. About 25 minutes on two shared cores, most of it the suite."""
    install(session, "jax", torch=False)
    session.run("python", "-c", (
        "import importlib.util, sys; "
        "sys.exit('torch is installed here' if importlib.util.find_spec('torch') else 0)"))
    session.run("python", "-c", "import gptspec.conformance; print('the judge imports without torch')")
    session.run("gptspec", "conformance", "--backend", "jax", "--dtype", "float32",
                "--profile", "quick", *session.posargs)
    # 16-bit: the forward checks (its generation checks pass too, 5 more minutes)
    session.run("gptspec", "conformance", "--backend", "jax", "--dtype", "bfloat16",
                "--profile", "quick", "--area", "forward", *session.posargs)
    session.run("pytest", "-q", "tests/test_judge_knows_no_backend.py")


@nox.session(python=PYTHON)
def soundness(session: nox.Session) -> None:
    """The soundness gate: correct backends written differently from the built-in one
    (meta/soundness/) must pass every check at the thorough profile, at 3 seeds drawn afresh
    each run, in float32, bfloat16 and float16; prints the seeds, backend × dtype × seed →
    passed/failed and the worst fraction of budget. Options after --: --quick (the CI part),
    --backend, --dtype, --seed N (repeatable: those seeds), --seeds N, --profile P, --jobs N,
    --record LEDGER (append each run), --ledger LEDGER (count the seeds passed on this
    judge, in several sittings: meta/soundness/ledger.jsonl)."""
    install(session)
    session.run("python", "-m", "meta.soundness.gate", *session.posargs)


@nox.session(python=PYTHON)
def ecosystem(session: nox.Session) -> None:
    """Every adapter of an engine nobody here wrote (gptspec.adapters.ecosystem.ENGINES)
    through the whole suite in every dtype it computes in: one JSON report per engine × dtype
    in docs/ecosystem/ (the Compatibility page's data); fails on a failure that
    docs/ecosystem/adjudications.toml does not explain. Options after --: --profile P
    (default: default), --out DIR, --engine NAME, --check PATTERN, --seed N."""
    install(session, "interop,jax,onnx,interop-onnx,independent")
    session.run("python", "-m", "gptspec.adapters.ecosystem", *session.posargs)


@nox.session(python=PYTHON)
def experiments(session: nox.Session) -> None:
    """The Notes' three open questions as controlled studies (``gptspec experiment all``):
    about 7 process-hours (3½ hours of two cores); results and SVG figures into docs/experiments/, which the
    site's Open questions page reads. Options after --: --quick (the CI part: tiny models,
    a few steps, one seed, into out/experiments; answers nothing), --jobs N, --seeds N,
    --data PATH, --out DIR. An interrupted run continues where it stopped."""
    install(session, "experiments")
    session.run("gptspec", "experiment", "all", *session.posargs)
