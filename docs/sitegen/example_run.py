"""The backend guide's sample run of the NumPy example backend, from a saved run.

``docs/examples/numpy_backend/run/`` holds what one real run of
``gptspec conformance --backend numpy-f32 --report report.json`` printed (``output.txt``)
and wrote (``report.json``). The guide shows an excerpt of that output and states its counts
as read from the report, so neither can drift from what the run measured; where the
report's checks differ from the suite's, the section says so (sitegen.evidence).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from sitegen.evidence import stale_banner
from sitegen.markup import esc, public_text

RUN_DIR = Path("docs") / "examples" / "numpy_backend" / "run"
MARKS = ("PASS", "FAIL", "N/I ", "N/A ", "BLKD", "ERR ")
SUMMARY = re.compile(r"^\d+ passed, \d+ failed, \d+ blocked, \d+ not implemented")
COMMAND = ("PYTHONPATH=docs/examples/numpy_backend/src gptspec conformance --backend "
           "gptspec_numpy_backend:NumpyBackend --dtype float32 --report "
           f"{RUN_DIR.as_posix()}/report.json > {RUN_DIR.as_posix()}/output.txt")


class ExampleRunError(ValueError):
    """A saved run that is missing, unreadable or disagrees with itself."""


def counts_text(checks: Iterable[dict]) -> str:
    """The CLI's summary line, computed from the report's checks."""
    checks = list(checks)
    n: dict[str, int] = {}
    for c in checks:
        n[str(c.get("status"))] = n.get(str(c.get("status")), 0) + 1
    text = (f"{n.get('pass', 0)} passed, {n.get('fail', 0) + n.get('error', 0)} failed, "
            f"{n.get('blocked', 0)} blocked, {n.get('not-implemented', 0)} not implemented")
    skipped = sum(int(c.get("not_applicable") or 0) for c in checks
                  if c.get("status") != "not-applicable")
    return (text + (f", {n['not-applicable']} not applicable" if n.get("not-applicable") else "")
            + (f"; {skipped} examples declared not applicable skipped" if skipped else ""))


def section(root: Path, suite_ids: Iterable[str], head: str = "") -> str:
    """The sample output (an excerpt: the header, the first checks, the last, the summary)
    and a sentence with the run's counts, or a build error naming the file."""
    folder = root / RUN_DIR
    try:
        output = (folder / "output.txt").read_text(encoding="utf-8")
        data = json.loads((folder / "report.json").read_text(encoding="utf-8"))
        run = data["runs"][0]
        checks = run["checks"]
        commit = (data.get("provenance") or {}).get("commit") or ""
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        raise ExampleRunError(f"the NumPy example's saved run in {RUN_DIR}: cannot be read "
                              f"({err}); make it with: {COMMAND}") from None
    lines = [line for line in output.splitlines() if line.strip()]
    header = [line for line in lines if line.startswith("gptspec conformance")]
    results = [line for line in lines if line.startswith(MARKS)]
    summary = [line for line in lines if SUMMARY.match(line)]
    expected = counts_text(checks)
    if len(header) != 1 or not results or summary != [expected]:
        raise ExampleRunError(f"{RUN_DIR}/output.txt and report.json are not one run (the "
                              f"output's summary {summary} against the report's {expected!r}); "
                              f"make both with: {COMMAND}")
    passed = [line for line in results if line.startswith("PASS")]
    shown = [*header, *passed[:2], "…", passed[-1] if passed else results[-1], expected]
    banner = stale_banner(f"The saved run ({RUN_DIR.as_posix()}/report.json)",
                          (str(c.get("id")) for c in checks), suite_ids, commit, head, root)
    prov = data.get("provenance") or {}
    when = ", ".join(str(prov[k]) for k in ("date", "cpu") if prov.get(k)) or "date not recorded"
    return (banner + "\n```text\n" + public_text("\n".join(shown)) + "\n```\n\n"
            f"That is an excerpt of a saved run ({esc(when)}; "
            f"`{RUN_DIR.as_posix()}/`): {expected}, of {len(checks)} checks. The example "
            "brings the forward pass and its operations, not the tokenizer, training or "
            "generation, which the suite reports as not implemented.\n")
