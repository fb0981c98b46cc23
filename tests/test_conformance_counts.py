"""What the report counts and says: a failure blocks only the checks it kept from running,
a check of one fixed configuration consults ``supports``, examples declared not
applicable are counted on the summary line, and a backend's name is not said twice."""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import pytest

from gptspec.conformance import report
from gptspec.conformance.runner import CheckResult, SuiteResult, run_suite
from gptspec.fast.backend import TorchBackend
from meta.keyhole import LogitsOnly


class ScaledLogits(LogitsOnly):
    """Logits × 1.25: gpt_forward.differential fails."""

    def forward(self, tokens: Any, params: Any, config: Any) -> Any:
        return np.asarray(super().forward(tokens, params, config)) * np.float32(1.25)


def test_a_failed_forward_blocks_the_checks_it_keeps_from_running_only():
    """Behind a failing gpt_forward, the judge's loops over the logits are blocked; the
    checks of a generate the engine never brought are not implemented, not blocked."""
    ids = ("gpt_forward.differential", "greedy_token.through_forward",
           "generate.greedy_reference")
    suite = run_suite(ScaledLogits(TorchBackend()), profile="quick", area=None,
                      select=lambda c: c.id in ids)
    assert {r.id: r.status for r in suite.results} == dict(zip(
        ids, ["fail", "blocked", "not-implemented"], strict=True))
    assert suite.counts["blocked"] == 1 and suite.counts["not-implemented"] == 1


@pytest.mark.parametrize("check_id", ["gpt_forward.gpt2_small", "gpt_backward.long_batch"])
def test_a_fixed_configuration_check_consults_supports(check_id):
    """The checks of one fixed configuration draw no examples: they ask the backend's
    supports themselves."""
    class NoLongContexts(TorchBackend):
        def supports(self, config: Any) -> str | None:
            return "contexts up to 512 only" if config.n_ctx > 512 else None

    suite = run_suite(NoLongContexts(), profile="quick", area=None,
                      select=lambda c: c.id == check_id)
    [result] = suite.results
    assert (result.status, result.detail) == ("not-applicable", "contexts up to 512 only")
    assert "1 not applicable" in report.summary(suite)



def test_examples_declared_not_applicable_are_counted_on_the_summary_line():
    suite = SuiteResult({}, {}, [CheckResult("a", [], "differential", "pass", 0.1, "", 30, 30,
                                             1.0, "", not_applicable=7)])
    assert report.summary(suite).endswith("; 7 examples declared not applicable skipped")


def test_the_version_line_does_not_repeat_the_name():
    assert report.named({"name": "tiktoken", "version": "tiktoken 0.12.0"}) == "tiktoken 0.12.0"
    assert report.named({"name": "jax", "version": "gptspec 0.1, jax 0.7"}) == \
        "jax gptspec 0.1, jax 0.7"


REFUSING = '''
from gptspec.conformance.protocol import NotApplicable
from gptspec.reference.backend import ReferenceBackend


def Refusing(dtype="float64"):
    if dtype != "float64":
        raise NotApplicable(f"computes in float64 only, not {dtype}")
    return ReferenceBackend()
'''


def test_a_refused_dtype_is_recorded_with_its_reason(tmp_path, monkeypatch, capsys):
    """A constructor that raises NotApplicable declines the dtype asked: the run is in
    the report with the reason (not an empty list of runs), and the others go on."""
    import json

    from gptspec.cli import main

    (tmp_path / "refusing_backend.py").write_text(REFUSING, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "report.json"
    code = main(["conformance", "--backend", "refusing_backend:Refusing", "--dtype",
                 "bfloat16", "--dtype", "float64", "--check", "softmax.differential",
                 "--profile", "quick", "--no-isolate", "--report", str(out)])
    assert code == 0
    runs = json.loads(out.read_text(encoding="utf-8"))["runs"]
    assert runs[0]["refused"] == "computes in float64 only, not bfloat16"
    assert runs[0]["checks"] == [] and "refused" not in runs[1]
    assert runs[1]["counts"]["pass"] == 1
    assert "refused: computes in float64 only, not bfloat16" in capsys.readouterr().out


@pytest.mark.parametrize("isolation", ["--no-isolate", "--isolate"])
def test_a_command_whose_every_run_was_refused_judged_nothing_and_says_so(
        tmp_path, monkeypatch, capsys, isolation):
    """Every dtype asked refused: nothing was judged, and the command exited 0 as if the
    backend had passed (hostile round 11). Status 2 and one line; the report holds the
    refused runs."""
    import json

    from gptspec.cli import main

    (tmp_path / "refusing_backend.py").write_text(REFUSING, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))  # worker
    out = tmp_path / "report.json"
    code = main(["conformance", "--backend", "refusing_backend:Refusing", "--dtype",
                 "bfloat16", "--dtype", "float16", "--check", "softmax.differential",
                 "--profile", "quick", "--report", str(out), isolation])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip() == (
        "gptspec conformance: error: nothing was judged: the backend refused every run asked "
        "(bfloat16 on its default device: computes in float64 only, not bfloat16; and 1 more)")
    runs = json.loads(out.read_text(encoding="utf-8"))["runs"]
    assert [r["refused"] for r in runs] == ["computes in float64 only, not bfloat16",
                                            "computes in float64 only, not float16"]


MODEL_ONLY = '''
from gptspec.reference.output import gpt_forward


class ModelOnly:
    protocol_version, name, version, device, dtype = 2, "model-only", "1", "cpu", "float64"
    capabilities = ("model",)

    def forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config)
'''


@pytest.mark.parametrize("isolation", ["--no-isolate", "--isolate"])
def test_a_command_that_judged_no_check_says_so(tmp_path, monkeypatch, capsys, isolation):
    """A run whose every check was not implemented (a model-only backend asked for the
    tokenizer area) exited 0, as a backend that passed."""
    from gptspec.cli import main

    (tmp_path / "model_only.py").write_text(MODEL_ONLY, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))  # worker
    code = main(["conformance", "--backend", "model_only:ModelOnly", "--dtype",
                 "float64", "--area", "tokenizer", "--profile", "quick", isolation])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "gptspec conformance: error: nothing was judged: the backend implements none of " \
           "the 9 checks asked, or cannot express them (e.g. " in err, err
    # one check judged is a verdict: status 0 for a pass
    code = main(["conformance", "--backend", "model_only:ModelOnly", "--dtype",
                 "float64", "--check", "gpt_forward.differential", "--check", "encode.*",
                 "--profile", "quick", isolation])
    assert code == 0, capsys.readouterr().err


def test_the_help_lists_the_exit_statuses(capsys):
    from gptspec.cli import main

    with pytest.raises(SystemExit):
        main(["conformance", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "exit status: 0 when every check judged passed" in text
    assert ("nothing judged (the backend refused every run asked, or every check was not "
            "implemented or not applicable)") in text


def test_the_list_of_checks_is_narrowed_by_check_patterns(capsys):
    from gptspec.cli import main
    from gptspec.conformance.registry import all_checks

    assert main(["conformance", "--list-checks", "--check", "softmax*", "--check",
                 "gelu.differential"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    wanted = [c.id for c in all_checks() if c.id.startswith("softmax") or c.id == "gelu.differential"]
    assert listed == wanted and len(listed) >= 3
