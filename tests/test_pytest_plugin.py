"""The conformance checks as pytest items (gptspec.pytest_plugin): pytest is run as a
backend author runs it, in a fresh process, on a few cheap checks of a reference backend
with planted faults; its verdicts, its JUnit XML, and the same verdicts under
pytest-xdist's -n 2 as in one process, isolated (the default) or not. The plugin is inert
without --gptspec-backend."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from gptspec.conformance.protocol import NotApplicable
from gptspec.reference.backend import ReferenceBackend

HERE = Path(__file__).resolve().parent


class Faulty(ReferenceBackend):
    """softmax wrong (its dependents blocked), no relu (not implemented), gelu declined
    for every input (not applicable); the other operations the reference's own."""

    relu = None

    def softmax(self, z, axis=-1):
        z = np.asarray(z, dtype=np.float64)
        return np.ones_like(z) / z.shape[axis]

    def gelu(self, x):
        raise NotApplicable("this engine has no erf")


class Hangs(ReferenceBackend):
    def relu(self, x):
        time.sleep(60)


# each name selects one check: pytest's -k matches substrings, so the checks whose ids
# contain another's (ffn_relu, ffn_gelu, token_embedding_one_hot) are left out
CHECKS = ("causal_mask.differential or (one_hot.differential and not embedding) or "
          "softmax.differential or attention_weights or (relu.differential and not ffn) or "
          "(gelu.differential and not ffn)")
EXPECTED = {
    "causal_mask.differential": ("passed", ""),
    "one_hot.differential": ("passed", ""),
    "softmax.differential": ("failure", "Failed: fail: "),
    "attention_weights.differential": ("skipped", "blocked by softmax.differential, which failed"),
    "relu.differential": ("skipped", "not implemented: backend has no operation relu"),
    "gelu.differential": ("skipped", "not applicable: this engine has no erf"),
}


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    # in tmp_path, outside this project's pytest configuration, as in a backend's own repo
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=tmp_path,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)


def _suite(tmp_path: Path, name: str, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    xml = tmp_path / f"{name}.xml"
    proc = _pytest(tmp_path, "--pyargs", "gptspec.conformance",
                   "--gptspec-backend=test_pytest_plugin:Faulty", "--gptspec-dtype=float64",
                   "--gptspec-profile=quick", f"--junitxml={xml}", *args)
    outcomes = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        verdict = [(child.tag, child.get("message", "")) for child in case
                   if child.tag in ("failure", "error", "skipped")]
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        outcomes[case.get("name")] = (*(verdict[0] if verdict else ("passed", "")),
                                      properties.get("gptspec_status"))
    return proc, outcomes


def _verdicts(outcomes: dict) -> dict:
    return {name: (kind, message.splitlines()[0] if message else "")
            for name, (kind, message, _) in outcomes.items()}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    return _suite(tmp_path_factory.mktemp("one"), "one", "-k", CHECKS)


def test_each_check_is_an_item_with_the_verdict_of_the_suite(one_process):
    proc, outcomes = one_process
    assert proc.returncode == 1, proc.stdout  # softmax failed
    assert set(outcomes) == set(EXPECTED), proc.stdout
    for name, (kind, message, _) in outcomes.items():
        want_kind, want_message = EXPECTED[name]
        assert kind == want_kind, (name, kind, message)
        assert message.startswith(want_message) or want_message in message, (name, message)
    assert {n: o[2] for n, o in outcomes.items()} == {
        "causal_mask.differential": "pass", "one_hot.differential": "pass",
        "softmax.differential": "fail", "attention_weights.differential": "blocked",
        "relu.differential": "not-implemented", "gelu.differential": "not-applicable"}
    # the console's fraction of budget and message on one line, its example below
    first, *rest = outcomes["softmax.differential"][1].splitlines()
    assert first.startswith("Failed: fail: softmax: worst at ") and "of budget)" in first
    assert any("Falsifying example" in line for line in rest)
    assert "reproduce: gptspec conformance --backend test_pytest_plugin:Faulty" in proc.stdout


def test_two_workers_give_the_verdicts_of_one_process(one_process, tmp_path):
    pytest.importorskip("xdist")
    proc, outcomes = _suite(tmp_path, "two", "-n", "2", "-k", CHECKS)
    assert "2 workers" in proc.stdout or "gw1" in proc.stdout, proc.stdout
    assert _verdicts(outcomes) == _verdicts(one_process[1]), proc.stdout


def test_in_pytests_process_the_verdicts_are_the_same(one_process, tmp_path):
    proc, outcomes = _suite(tmp_path, "in-process", "--gptspec-no-isolate", "-k", CHECKS)
    assert outcomes == one_process[1], proc.stdout


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_a_check_blocked_by_a_failure_left_out_of_the_session_fails_naming_it(tmp_path,
                                                                               workers):
    """-k leaves softmax.differential out; attention_weights runs it in its own process
    first. Blocked by it, the item was a skip and the session green, where a whole run
    (and gptspec conformance --check) fails."""
    if workers:
        pytest.importorskip("xdist")
    proc, outcomes = _suite(tmp_path, "alone", "-k", "attention_weights", *workers)
    assert proc.returncode == 1, proc.stdout
    blocked = EXPECTED["attention_weights.differential"][1]
    assert _verdicts(outcomes) == {"attention_weights.differential": (
        "failure", f"Failed: {blocked} (not selected here: select it to see why)")}, proc.stdout
    assert outcomes["attention_weights.differential"][2] == "blocked"  # the verdict is kept


class RefusesEveryDtype(ReferenceBackend):
    def __init__(self, dtype=None):
        raise NotApplicable(f"this engine has no {dtype}")


@pytest.mark.parametrize("how", [[], ["--gptspec-no-isolate"], ["-n", "2"]])
def test_a_backend_that_refuses_the_dtype_asked_passes_nothing(tmp_path, how):
    """Every item a skip, and the session was green, where gptspec conformance says
    nothing was judged."""
    if "-n" in how:
        pytest.importorskip("xdist")
    proc = _pytest(tmp_path, "--pyargs", "gptspec.conformance",
                   "--gptspec-backend=test_pytest_plugin:RefusesEveryDtype",
                   "--gptspec-dtype=float32", "--gptspec-profile=quick",
                   "-k", "softmax.differential or causal_mask.differential", *how)
    assert proc.returncode == 1, proc.stdout
    assert "2 skipped" in proc.stdout and "failed" not in proc.stdout, proc.stdout
    assert ("nothing was judged: the backend refused every run asked (float32 on its "
            "default device: this engine has no float32)") in proc.stdout, proc.stdout


def test_a_session_that_judges_no_check_passes_nothing(tmp_path):
    """As gptspec conformance: checks all not implemented or not applicable judge
    nothing, which is no pass; one check judged among them is a pass."""
    nothing = "nothing was judged: the backend implements none of the 2 checks asked"
    for selection, judged in [
            ("(relu.differential and not ffn) or (gelu.differential and not ffn)", False),
            ("(relu.differential and not ffn) or causal_mask.differential", True)]:
        proc, _ = _suite(tmp_path, "judged", "-k", selection)
        assert proc.returncode == (0 if judged else 1), proc.stdout
        assert "failed" not in proc.stdout, proc.stdout  # skips and passes only, either way
        assert (nothing in proc.stdout) is not judged, proc.stdout


def test_a_check_past_its_time_limit_is_an_error_and_the_run_goes_on(tmp_path):
    proc = _pytest(tmp_path, "--pyargs", "gptspec.conformance",
                   "--gptspec-backend=test_pytest_plugin:Hangs", "--gptspec-dtype=float64",
                   "--gptspec-profile=quick", "--gptspec-timeout=8", "-rA",
                   "-k", "(relu.differential and not ffn) or causal_mask.differential")
    assert proc.returncode == 1, proc.stdout
    # 8 s: the check that does not hang must finish inside it on a machine busy with other
    # work too (at 1 s it timed out there), the one that hangs sleeps for 60
    assert "FAILED registry.py::relu.differential - Failed: error: timed out after 8 s" \
        in proc.stdout, proc.stdout
    assert "PASSED registry.py::causal_mask.differential" in proc.stdout, proc.stdout


def test_the_area_is_a_keyword(tmp_path):
    proc = _pytest(tmp_path, "--pyargs", "gptspec.conformance", "--gptspec-backend=reference",
                   "--collect-only", "-q", "-k", "costs")
    assert proc.returncode == 0, proc.stdout
    ids = [line.rsplit("::", 1)[1] for line in proc.stdout.splitlines() if "::" in line]
    from gptspec.conformance.registry import all_checks

    assert ids == [c.id for c in all_checks("costs")]


def test_a_misspelt_backend_stops_the_run_in_one_line(tmp_path):
    proc = _pytest(tmp_path, "--pyargs", "gptspec.conformance",
                   "--gptspec-backend=no_such_module_here:Backend")
    assert proc.returncode == 4, proc.stdout  # a usage error
    assert "--gptspec-backend: cannot import backend module 'no_such_module_here'" in proc.stdout


@pytest.mark.parametrize("option, message", [
    ("--gptspec-timeout=inf", "--gptspec-timeout (seconds; 0 for none) must be a finite number"),
    ("--gptspec-timeout=1e308", "--gptspec-timeout (seconds; 0 for none) must be in [0, 86400]"),
    ("--gptspec-seed=-1", "--gptspec-seed must lie in [0, 2^63)"),
    ("--gptspec-adjudicate-with=no_such_module_here:B",
     "--gptspec-adjudicate-with: cannot import backend module 'no_such_module_here'"),
])
def test_the_options_are_refused_as_the_cli_refuses_them(tmp_path, option, message):
    """The limits of gptspec conformance's --timeout, --seed and --adjudicate-with: a
    timeout past a day used to fail every item with an OverflowError traceback."""
    proc = _pytest(tmp_path, "--pyargs", "gptspec.conformance",
                   "--gptspec-backend=gptspec.reference.backend:ReferenceBackend", option)
    assert proc.returncode == 4, proc.stdout  # a usage error, before any item runs
    assert f"ERROR: {message}" in proc.stdout and "Traceback" not in proc.stdout


def test_without_the_option_the_plugin_collects_and_imports_nothing(tmp_path):
    (tmp_path / "test_other.py").write_text(
        "import sys\n\n\ndef test_judge_not_imported():\n"
        "    assert 'gptspec.conformance' not in sys.modules\n")
    proc = _pytest(tmp_path, "test_other.py", "-q")
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout
    assert "gptspec-" in _pytest(tmp_path, "test_other.py").stdout  # it was loaded (plugins:)
    proc = _pytest(tmp_path, "--pyargs", "gptspec.conformance", "-q")
    assert proc.returncode == 5, proc.stdout  # no tests collected


def test_the_plugins_profiles_are_the_suites():
    from gptspec import pytest_plugin
    from gptspec.conformance.context import PROFILES

    assert pytest_plugin.PROFILES == tuple(PROFILES)


@pytest.mark.parametrize("isolation", [[], ["--gptspec-no-isolate"]])
@pytest.mark.parametrize("where", ["check", "import"])
def test_a_backends_os_exit_is_an_error_not_pytests_exit_status(tmp_path, where, isolation):
    """os._exit(0) in a check (or at the backend module's import) ended pytest with status
    0 and no output: a CI job went green for a backend never judged (hostile round 7)."""
    (tmp_path / "exits.py").write_text(
        "import os\nimport numpy as np\n"
        + ("os._exit(0)\n" if where == "import" else "")
        + "class Backend:\n"
        "    protocol_version = 2\n"
        "    name, version, device, dtype = 'exits', '1', 'cpu', 'float64'\n"
        "    def softmax(self, z, axis=-1):\n"
        "        os._exit(0)\n"
        "    def forward(self, tokens, params, config):\n"
        "        return np.zeros((*np.shape(tokens), config.vocab_size))\n")
    proc = _pytest(tmp_path, "--pyargs", "gptspec.conformance", "--gptspec-backend=exits:Backend",
                   "--gptspec-profile=quick", "-k", "softmax.differential or gpt_forward.differential",
                   *isolation)
    assert proc.returncode == 1, proc.stdout
    if isolation:
        assert "os._exit(0) was called in the judge's process (the pytest plugin)" in proc.stdout
    elif where == "check":  # its worker ended, the check an error; a fresh worker goes on
        assert "the backend ended the worker process (exit code 0)" in proc.stdout, proc.stdout
    else:
        assert "failed to start: the backend ended the worker process (exit code 0)" in \
            proc.stdout, proc.stdout
    assert "2 failed" in proc.stdout


def test_a_backend_that_skips_itself_fails_its_item(tmp_path):
    """pytest.skip() inside the backend's forward: the item was skipped, not failed."""
    tests = str(HERE)
    proc = _pytest(tmp_path, "--pyargs", "gptspec.conformance",
                   "--gptspec-backend=hostile_backends:SkipsItself", "--gptspec-dtype=float64",
                   "--gptspec-profile=quick", "-k", "gpt_forward.differential", "-q",
                   f"--rootdir={tests}")
    assert proc.returncode == 1, proc.stdout
    assert "1 failed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout
    assert "cannot reject, skip or stop" in proc.stdout, proc.stdout
