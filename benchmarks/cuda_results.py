"""The record of a GPU run for the Verification page: what the device tool brought back
from ``benchmarks/cuda_check.sh`` (and any follow-up call) condensed into one JSON file
that the site renders (docs/sitegen/verification.py, ``cuda_section``).

    python -m benchmarks.cuda_results --date 2026-11-27 --run OUT1 --commit e243cf2 \\
        --note "what the call found" [--run OUT2 --commit e7e56a1 --note …] \\
        --json docs/cuda-results.json

Each OUT folder may hold conformance.tar.gz (CLI JSON reports and pytest-plugin JUnit XML),
bench.json, all.log (its env.txt part names GPU, driver and versions) and *.txt outputs of
extra commands, kept verbatim. A JUnit file that lists fewer checks than the area has was
cut short: the checks it lacks are counted as unfinished, never as passed.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import re
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from gptspec.conformance.registry import all_checks


def _environment(folder: Path) -> dict[str, str]:
    log = folder / "all.log"
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    env: dict[str, str] = {}
    gpu = re.search(r"^(NVIDIA [^,]+), (\d+ MiB), ([\d.]+)", text, re.M)
    if gpu:
        env.update(gpu=gpu[1], memory=gpu[2], driver=gpu[3])
    versions = re.search(r"^torch (\S+) cuda (\S+) numpy (\S+) sympy (\S+) hypothesis (\S+)"
                         r"(?: transformers (\S+))?", text, re.M)
    if versions:
        names = ("torch", "cuda", "numpy", "sympy", "hypothesis", "transformers")
        env.update({n: v for n, v in zip(names, versions.groups(), strict=True) if v})
    return env


def _from_report(name: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for run in data["runs"]:
        checks = run["checks"]
        passed = [c for c in checks if c["status"] == "pass"]
        worst = max(passed, key=lambda c: c["worst_fraction"] or 0.0, default=None)
        rows.append({"target": name, "backend": run["backend"]["name"],
                     "profile": run["settings"]["profile"], "dtype": run["backend"]["dtype"],
                     "area": run["settings"]["area"], "seed": run["settings"]["seed"],
                     "counts": run["counts"], "unfinished": 0,
                     "worst": None if worst is None else [worst["id"], worst["worst_fraction"]],
                     "failed": [c["id"] for c in checks if c["status"] in ("fail", "error")]})
    return rows


def _from_junit(name: str, text: bytes) -> dict[str, Any]:
    """A pytest-plugin run (``thorough-<dtype>.xml``): statuses from the properties."""
    cases = []
    for case in ET.parse(io.BytesIO(text)).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        if "gptspec_status" in props:
            cases.append((case.get("name"), props["gptspec_status"],
                          props.get("gptspec_worst_fraction")))
    counts = collections.Counter(status for _, status, _ in cases)
    passed = [(i, float(f)) for i, s, f in cases if s == "pass" and f not in (None, "None")]
    dtype = name.removeprefix("thorough-")
    return {"target": name, "backend": "torch", "profile": "thorough", "dtype": dtype,
            "area": "all", "seed": 0, "counts": dict(counts),
            "unfinished": len(all_checks()) - len(cases),
            "worst": list(max(passed, key=lambda p: p[1])) if passed else None,
            "failed": [i for i, s, _ in cases if s in ("fail", "error")]}


def read_run(folder: Path, commit: str, note: str = "") -> dict[str, Any]:
    run: dict[str, Any] = {"commit": commit, "note": note, "environment": _environment(folder),
                           "conformance": [], "bench": None, "outputs": {}}
    archive = folder / "conformance.tar.gz"
    if archive.exists():
        with tarfile.open(archive) as tar:
            for member in sorted(tar.getmembers(), key=lambda m: m.name):
                handle = tar.extractfile(member) if member.isfile() else None
                if handle is None:
                    continue
                stem = Path(member.name).stem
                if member.name.endswith(".json"):
                    run["conformance"] += _from_report(stem, json.load(handle))
                elif member.name.endswith(".xml"):
                    run["conformance"].append(_from_junit(stem, handle.read()))
    for xml in sorted(folder.glob("*.xml")):
        run["conformance"].append(_from_junit(xml.stem, xml.read_bytes()))
    bench = folder / "bench.json"
    if bench.exists():
        data = json.loads(bench.read_text(encoding="utf-8"))
        run["bench"] = {"environment": data["environment"],
                        "metrics": [{k: m[k] for k in ("group", "name", "median", "unit", "note")}
                                    for m in data["metrics"]],
                        "ratios": [{k: r[k] for k in ("group", "name", "median", "goal_text",
                                                      "met")} for r in data["ratios"]]}
    for text in sorted(folder.glob("*.txt")):
        if text.name != "summary.txt":
            lines = text.read_text(encoding="utf-8").splitlines()
            run["outputs"][text.name] = [ln for ln in lines if "Warning" not in ln]
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", type=Path, required=True)
    parser.add_argument("--commit", action="append", required=True)
    parser.add_argument("--note", action="append", default=[],
                        help="what the call found, one per --run, in order")
    parser.add_argument("--date", required=True)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    if len(args.run) != len(args.commit):
        parser.error("give one --commit per --run")
    notes = args.note + [""] * (len(args.run) - len(args.note))
    runs = [read_run(f, c, n) for f, c, n in zip(args.run, args.commit, notes, strict=True)]
    data = {"schema": "gptspec-cuda", "date": args.date, "runs": runs}
    args.json.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
