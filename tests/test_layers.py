"""The layers point one way (spec ← reference ← fast; the judge, conformance, on spec and
reference only), and the wheel carries the product only: the suite's own test tooling
(meta/: planted bugs, their runner, forced-kernel and soundness variants) is never
installed. test_judge_knows_no_backend.py holds the judge's side with torch blocked."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_judge_knows_no_backend import _imports

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "gptspec"

# what each layer may not import, at any depth (lazy imports in functions count)
NOT_BELOW = {
    "spec": ("gptspec.reference", "gptspec.fast", "gptspec.conformance", "gptspec.adapters",
             "gptspec.cli", "gptspec.experiments", "meta", "torch"),
    "reference": ("gptspec.fast", "gptspec.conformance", "gptspec.adapters", "gptspec.cli",
                  "gptspec.experiments", "meta", "torch"),
    "fast": ("gptspec.conformance", "gptspec.adapters", "gptspec.cli", "gptspec.experiments",
             "meta"),
}


def _violations(folder: Path, forbidden: tuple[str, ...]) -> list[str]:
    return [f"{path.relative_to(folder.parent).as_posix()}:{line} imports {name}"
            for path in sorted(folder.rglob("*.py")) for line, name in _imports(path)
            if any(name == f or name.startswith(f + ".") for f in forbidden)]


@pytest.mark.parametrize("layer", sorted(NOT_BELOW))
def test_a_layer_imports_nothing_above_it(layer):
    assert len(list((PACKAGE / layer).rglob("*.py"))) > 5  # the scan really reads the layer
    bad = _violations(PACKAGE / layer, NOT_BELOW[layer])
    assert not bad, "\n".join(bad)


def test_no_module_of_the_package_imports_the_test_tooling():
    bad = [f"{path.relative_to(ROOT)}:{line} imports {name}"
           for path in sorted(PACKAGE.rglob("*.py")) for line, name in _imports(path)
           if name == "meta" or name.startswith("meta.")]
    assert not bad, "\n".join(bad)


def test_the_scan_would_see_fast_importing_the_judge(tmp_path):
    (tmp_path / "fast").mkdir()
    (tmp_path / "fast" / "planted.py").write_text(
        "import torch\ndef f():\n    from gptspec.conformance.runner import run_suite\n")
    assert _violations(tmp_path / "fast", NOT_BELOW["fast"]) == [
        "fast/planted.py:3 imports gptspec.conformance.runner"]


def test_the_wheel_carries_no_test_tooling(tmp_path):
    # built from a copy, so that no build/ folder of an earlier build is packed, and the
    # checkout is left as it was
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("*.egg-info",
                                                                             "__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(tree)], check=True, timeout=600,
                   capture_output=True)
    (wheel,) = tmp_path.glob("gptspec-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    modules = [n for n in names if n.endswith(".py")]
    assert "gptspec/spec/config.py" in modules and "gptspec/fast/model.py" in modules
    assert "gptspec/fast/kernels/gelu_tanh.cpp" in names  # built on first use, from the wheel
    tooling = [n for n in names
               if n.split("/")[0] not in ("gptspec",) and ".dist-info/" not in n
               or any(word in n for word in ("mutant", "mutation", "sdpa_kernels", "soundness"))]
    assert not tooling, tooling
