"""KaTeX, installed at build time from the npm registry (never a CDN, never committed).

``ensure_katex`` installs the pinned version into ``.cache/katex`` once; later builds
reuse it, so a build is offline once the cache exists. ``parse_errors`` runs KaTeX's own
parser (through node) over LaTeX strings: the same code that renders them in the browser.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

KATEX_VERSION = "0.16.22"
CACHE = Path(".cache") / "katex"


class KatexError(RuntimeError):
    """KaTeX could not be installed or run; the message says what to do."""


def katex_package(root: Path) -> Path:
    return root / CACHE / "node_modules" / "katex"


def installed_version(package: Path) -> str | None:
    try:
        return json.loads((package / "package.json").read_text(encoding="utf-8"))["version"]
    except (OSError, ValueError, KeyError):
        return None


def ensure_katex(root: Path) -> Path:
    """The KaTeX package folder (with ``dist/``), installing it with npm if needed."""
    package = katex_package(root)
    complete = (package / "dist" / "katex.min.js").is_file()
    if installed_version(package) == KATEX_VERSION and complete:
        return package
    npm = shutil.which("npm")
    if npm is None:
        raise KatexError(f"npm is needed once to install KaTeX {KATEX_VERSION} from the npm "
                         "registry into .cache/katex (apt-get install npm)")
    prefix = root / CACHE
    prefix.mkdir(parents=True, exist_ok=True)
    cmd = [npm, "install", "--no-audit", "--no-fund", "--no-save", "--prefix", str(prefix),
           f"katex@{KATEX_VERSION}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or installed_version(package) != KATEX_VERSION:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise KatexError(f"npm could not install katex@{KATEX_VERSION}: {tail[0]}")
    return package


# Reads a JSON list of [display, latex] pairs on stdin, prints a JSON list of error
# messages (null where the string parses).
_PARSE_SCRIPT = """
const katex = require(process.argv[1]);
let input = "";
process.stdin.on("data", (d) => { input += d; });
process.stdin.on("end", () => {
  const errors = JSON.parse(input).map(([display, tex]) => {
    try { katex.renderToString(tex, {displayMode: display, throwOnError: true}); return null; }
    catch (e) { return String(e.message); }
  });
  process.stdout.write(JSON.stringify(errors));
});
"""


def parse_errors(latex: Sequence[tuple[bool, str]], root: Path) -> list[str | None]:
    """KaTeX's error message for each (display, latex) pair, or None where it parses."""
    node = shutil.which("node")
    if node is None:
        raise KatexError("node is needed to run KaTeX's parser (apt-get install nodejs)")
    package = ensure_katex(root)
    done = subprocess.run([node, "-e", _PARSE_SCRIPT, str(package)], input=json.dumps(
        [list(p) for p in latex]), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise KatexError(f"node failed running KaTeX: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout)
