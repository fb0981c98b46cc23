"""Saved evidence against the suite it claims to describe: the build's commit, and a banner
wherever a saved report ran another set of checks than the suite has now.

Reports (docs/ecosystem/*.json, out/conformance/*.json, the numpy example's run) are saved
once and read at every build, while the suite keeps changing. A report that ran 70 checks
when the suite has 71 still renders, but the page says so, naming the checks it lacks or
holds in excess, and the commit it was produced at against the one the site is built from.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

from sitegen.markup import code, esc

FALLBACK_REF = "main"  # what source links point at outside a git checkout


def build_commit(root: Path) -> str:
    """The commit the site is built from (``git rev-parse HEAD``), or "" outside a checkout
    (an unpacked source archive) or without git."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and len(commit) == 40 else ""


def commits_between(root: Path, old: str, new: str) -> int | None:
    """How many commits ``new`` is ahead of ``old``; None where git cannot tell (a commit
    this clone lacks, no git)."""
    if not old or not new:
        return None
    try:
        done = subprocess.run(["git", "rev-list", "--count", f"{old}..{new}"], cwd=root,
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return int(done.stdout) if done.returncode == 0 and done.stdout.strip().isdigit() else None


def _ids(ids: Iterable[str]) -> str:
    # every one named, however many: "and 15 more" would leave the reader to find them
    return ", ".join(code(i) for i in sorted(ids))


def stale_banner(what: str, report_ids: Iterable[str], suite_ids: Iterable[str],
                 report_commit: str = "", head: str = "", root: Path | None = None) -> str:
    """A warning naming the checks a report lacks and those the suite no longer has; ""
    when the report ran exactly the suite's checks. ``what`` names the report in words."""
    ran, suite = set(report_ids), set(suite_ids)
    missing, extra = suite - ran, ran - suite
    if not missing and not extra:
        return ""
    parts = [f"{esc(what)} ran {len(ran)} checks; the suite this site is built with has "
             f"{len(suite)}."]
    if missing:
        parts.append(f"Not in the report ({len(missing)}): {_ids(missing)}.")
    if extra:
        parts.append(f"In the report but no longer in the suite ({len(extra)}): {_ids(extra)}.")
    if report_commit:
        behind = commits_between(root, report_commit, head) if root and head else None
        where = f"It was produced at commit {code(report_commit[:10])}"
        if head:
            where += f"; this site is built from {code(head[:10])}"
            if behind:
                where += f", {behind} commit{'s' * (behind != 1)} later"
        parts.append(where + ".")
    else:
        parts.append("It does not record the commit it was produced at.")
    parts.append("Rerun it to bring the evidence up to date.")
    return ('<div class="admonition warning gs-stale">\n<p class="admonition-title">'
            "Stale evidence</p>\n<p>" + " ".join(parts) + "</p>\n</div>\n")
