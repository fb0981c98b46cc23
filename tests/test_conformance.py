"""The suite against the built-in backends, its traceability to the spec, and its CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gptspec import reference
from gptspec.conformance.registry import all_checks, checks_for
from gptspec.conformance.runner import run_suite
from gptspec.fast.backend import TorchBackend
from gptspec.reference.backend import ReferenceBackend
from gptspec.spec import REGISTRY


def _assert_passes(suite):
    bad = [f"{r.id}: {r.status}: {r.detail}" for r in suite.results if r.status != "pass"]
    assert not bad, "\n".join(bad)
    assert len(suite.results) == len(all_checks("forward"))


def test_the_reference_passes_the_suite_as_a_backend():
    _assert_passes(run_suite(ReferenceBackend(), profile="quick"))


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_the_torch_backend_passes_the_suite(dtype):
    suite = run_suite(TorchBackend("cpu", dtype), profile="quick", seed=1)
    _assert_passes(suite)
    measured = [r.worst_fraction for r in suite.results if r.worst_fraction]
    assert measured, "no comparison used any of its budget: the checks compared nothing"


FORWARD_GROUPS = ("embedding", "attention", "block", "output")


@pytest.mark.parametrize("entry", [e.id for e in REGISTRY if e.group in FORWARD_GROUPS])
def test_every_forward_entry_has_a_reference_function_and_a_check(entry):
    e = REGISTRY[entry]
    assert callable(getattr(reference, e.reference, None)), f"no reference {e.reference}"
    assert checks_for(entry), f"spec entry {entry!r} has no conformance check"


def test_every_check_covers_existing_entries_and_depends_on_existing_checks():
    ids = {c.id for c in all_checks()}
    for c in all_checks():
        for entry in c.entries:
            assert entry in REGISTRY, f"check {c.id} names unknown spec entry {entry!r}"
        assert set(c.depends_on) <= ids
        assert c.doc, f"check {c.id} has no docstring: the check is its documentation"
        assert c.budget, f"check {c.id} does not say how its tolerance is derived"


def test_dependencies_run_before_dependents():
    order = [c.id for c in all_checks()]
    for c in all_checks():
        for dep in c.depends_on:
            assert order.index(dep) < order.index(c.id)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "gptspec", "conformance", *args],
                          capture_output=True, text=True, timeout=600)


def test_cli_writes_a_versioned_json_report_and_markdown(tmp_path):
    out, md = tmp_path / "report.json", tmp_path / "report.md"
    proc = _cli("--dtype", "float32", "--profile", "quick", "--check", "softmax*",
                "--check", "layer_norm.differential", "--report", str(out), "--markdown", str(md))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["schema"] == "gptspec-conformance" and data["version"] == 4
    assert data["protocol"] == 2  # the argument order the backends were called with
    assert "gptspec conformance (protocol 2) — backend torch" in proc.stdout
    # what produced it: this checkout's commit, a date, the machine
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent).stdout.strip()
    prov = data["provenance"]
    assert prov["commit"] == (head or None) and prov["date"].endswith("UTC")
    assert prov["machine"] and prov["cpu"] and isinstance(prov["modified"], (bool, type(None)))
    (run,) = data["runs"]
    assert run["backend"]["dtype"] == "float32" and run["backend"]["name"] == "torch"
    ids = {c["id"] for c in run["checks"]}
    assert ids == {"softmax.differential", "softmax_shifted.differential",
                   "softmax.stability", "layer_norm.differential"}
    assert all(c["status"] == "pass" and 0 <= c["worst_fraction"] <= 1 for c in run["checks"])
    assert "backend torch" in proc.stdout and "of budget" in proc.stdout
    assert "| `layer_norm.differential` |" in md.read_text()


def test_cli_fails_and_reproduces_for_a_broken_backend(tmp_path):
    module = tmp_path / "broken_backend.py"
    module.write_text(
        "from gptspec.reference.backend import ReferenceBackend\n"
        "import numpy as np\n"
        "class Broken(ReferenceBackend):\n"
        "    def causal_mask(self, T):\n"
        "        return np.zeros((T, T))\n")
    proc = subprocess.run([sys.executable, "-m", "gptspec", "conformance", "--backend",
                           "broken_backend:Broken", "--check", "causal_mask.*", "--profile",
                           "quick"], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 1
    assert "FAIL  causal_mask.differential" in proc.stdout
    assert "reproduce: gptspec conformance --backend broken_backend:Broken" in proc.stdout


@pytest.mark.parametrize("spec, message", [
    ("no_such_module_xyz:Backend", "cannot import backend module"),
    ("json:NoSuchThing", "has no attribute"),
    ("nonsense", "unknown backend"),
])
def test_cli_names_a_bad_backend_in_one_line(spec, message):
    proc = _cli("--backend", spec)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_cli_lists_installed_backends():
    proc = _cli("--list-backends")
    assert proc.returncode == 0
    assert "torch" in proc.stdout and "reference" in proc.stdout
