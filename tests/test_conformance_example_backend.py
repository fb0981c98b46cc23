"""The example third-party backend (docs/examples/numpy_backend, pure NumPy float32) is
found through its entry point and passes the suite, run as a user runs it; the same run
fails on a copy with a planted bug, so the pass means something."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from gptspec.conformance.registry import all_checks

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "numpy_backend"


def _install_metadata(site: Path) -> str:
    """What `pip install docs/examples/numpy_backend` would leave for importlib.metadata:
    a dist-info folder with the project's entry points (no network, no build)."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    eps = project["entry-points"]["gptspec.backends"]
    info = site / f"gptspec_numpy_backend-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (info / "entry_points.txt").write_text(
        "[gptspec.backends]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    return os.pathsep.join([str(site), str(EXAMPLE / "src")])


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    path = _install_metadata(tmp_path / "site")
    return subprocess.run([sys.executable, "-m", "gptspec", "conformance", *args],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": path})


def test_the_example_imports_nothing_from_gptspec():
    tree = ast.parse((EXAMPLE / "src" / "gptspec_numpy_backend" / "__init__.py").read_text())
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names}
    modules |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert modules == {"__future__", "math", "typing", "numpy"}


def test_the_example_backend_is_found_by_name_and_passes_the_suite(tmp_path):
    report = tmp_path / "numpy.json"
    listed = _cli(tmp_path, "--list-backends")
    assert "numpy-f32" in listed.stdout and "gptspec_numpy_backend:NumpyBackend" in listed.stdout
    proc = _cli(tmp_path, "--backend", "numpy-f32", "--profile", "quick", "--report", str(report))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    (run,) = json.loads(report.read_text())["runs"]
    assert run["backend"]["name"] == "numpy-f32" and run["backend"]["dtype"] == "float32"
    statuses = {c["id"]: c["status"] for c in run["checks"]}
    # every forward check passes, and greedy decoding and sampling driven through its
    # forward; the tokenizer and generation areas it does not bring are not implemented
    judged = {c.id for c in all_checks("forward")} | {
        "greedy_token.through_forward", "sampling_distribution.through_forward"}
    assert {statuses[i] for i in judged} == {"pass"}, statuses
    assert {s for i, s in statuses.items() if i not in judged} <= {"not-implemented"}


def test_the_same_run_fails_on_the_example_with_a_planted_bug(tmp_path):
    (tmp_path / "buggy_numpy.py").write_text(
        "import numpy as np\n"
        "from gptspec_numpy_backend import NumpyBackend\n"
        "class NoShift(NumpyBackend):\n"
        "    def softmax(self, z, axis=-1):\n"
        "        e = np.exp(np.asarray(z, dtype=np.float32))\n"
        "        return e / e.sum(axis=axis, keepdims=True)\n")
    path = _install_metadata(tmp_path / "site")
    proc = subprocess.run(
        [sys.executable, "-m", "gptspec", "conformance", "--backend", "buggy_numpy:NoShift",
         "--profile", "quick", "--check", "softmax.differential"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), path])})
    assert proc.returncode == 1
    assert "FAIL  softmax.differential" in proc.stdout
