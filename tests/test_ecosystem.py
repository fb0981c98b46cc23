"""The ecosystem run (gptspec.adapters.ecosystem) and its Compatibility page: reports carry
their provenance, a failure is published only with an adjudication, the page renders what
the reports say, and the committed reports are all explained."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from gptspec.adapters import ecosystem
from gptspec.adapters.ecosystem import Engine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))

from sitegen import compatibility  # noqa: E402

# A backend with one operation, the softmax, off by a factor (1 + 1e-3): far outside any
# float64 budget, so softmax.differential fails on its first example.
BROKEN_SOFTMAX = '''
import numpy as np

class BrokenSoftmax:
    name, version, device, dtype = "broken-softmax", "0", "cpu", "float64"
    protocol_version = 2

    def forward(self, tokens, params, config):
        raise NotImplementedError

    def softmax(self, z, axis=-1):
        e = np.exp(z - z.max(axis=axis, keepdims=True))
        return 1.001 * e / e.sum(axis=axis, keepdims=True)
'''

ADJUDICATION = '''
[[adjudication]]
engine = "broken-softmax"
check = "softmax.differential"
verdict = "engine"
reason = "Every probability is 0.1% too large."
smallest_input = "z = [0.0]"
'''


@pytest.fixture
def broken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Engine:
    (tmp_path / "broken_softmax.py").write_text(BROKEN_SOFTMAX)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the suite runs it in a subprocess
    return Engine("broken_softmax:BrokenSoftmax", ("float64",), "", "a planted bug")


def _run(tmp_path: Path, engine: Engine, adjudications: str = "") -> int:
    table = tmp_path / "adjudications.toml"
    table.write_text(adjudications)
    return ecosystem.main(["--out", str(tmp_path / "reports"), "--profile", "quick",
                           "--check", "softmax.differential", "--adjudications", str(table)],
                          engines=[engine])


def test_a_report_records_engine_commit_date_machine_dtype_profile_and_seed(tmp_path: Path):
    engine = Engine("reference", ("float64",), "", "the float64 reference")
    assert _run(tmp_path, engine) == 0
    data = json.loads((tmp_path / "reports" / "reference-float64.json").read_text())
    prov = data["provenance"]
    assert set(prov) >= {"commit", "modified", "date", "machine", "cpu", "cores", "python"}
    assert prov["cores"] >= 1 and prov["cpu"] and "UTC" in prov["date"]
    assert prov["commit"] is None or len(prov["commit"]) == 40
    (run,) = data["runs"]
    assert run["backend"]["name"] == "reference" and run["backend"]["dtype"] == "float64"
    assert run["backend"]["version"] not in ("", "?")
    assert run["settings"]["profile"] == "quick" and run["settings"]["seed"] == 0
    (check,) = run["checks"]
    assert check["id"] == "softmax.differential" and check["status"] == "pass"
    assert 0 <= check["worst_fraction"] <= 1


def test_a_failure_without_an_adjudication_is_refused(tmp_path: Path, broken: Engine,
                                                      capsys: pytest.CaptureFixture[str]):
    assert _run(tmp_path, broken) == 1
    err = capsys.readouterr().err
    assert "softmax.differential failed with no adjudication" in err
    report = json.loads((tmp_path / "reports" / f"{broken.backend}-float64.json").read_text())
    assert report["runs"][0]["checks"][0]["minimal_example"]  # what the page will show
    table = tmp_path / "adjudications.toml"
    table.write_text(ADJUDICATION)  # explained, the same report is accepted
    assert ecosystem.unexplained([report], ecosystem.load_adjudications(table)) == []
    table.write_text(ADJUDICATION.replace('verdict', 'dtypes = ["bfloat16"]\nverdict'))
    assert len(ecosystem.unexplained([report], ecosystem.load_adjudications(table))) == 1


def test_an_adjudication_must_say_its_verdict_reason_and_smallest_input(tmp_path: Path):
    bad = tmp_path / "bad.toml"
    bad.write_text(ADJUDICATION.replace('verdict = "engine"', 'verdict = "unsure"'))
    with pytest.raises(ecosystem.AdjudicationError, match="verdict 'unsure' is not one of"):
        ecosystem.load_adjudications(bad)
    bad.write_text(ADJUDICATION.replace('smallest_input = "z = [0.0]"', ""))
    with pytest.raises(ecosystem.AdjudicationError, match="entry 1 lacks smallest_input"):
        ecosystem.load_adjudications(bad)
    assert ecosystem.load_adjudications(tmp_path / "absent.toml") == []


def _report(engine: str, dtype: str, checks: list[dict]) -> dict:
    return {"schema": "gptspec-conformance", "version": 3,
            "provenance": {"commit": "0123456789abcdef0123", "modified": False,
                           "date": "2026-01-02 03:04 UTC", "machine": "Linux-test",
                           "cpu": "Test CPU 9000", "cores": 7, "python": "3.11.0"},
            "runs": [{"backend": {"name": engine, "version": f"{engine} 1.2.3", "device": "cpu",
                                  "dtype": dtype},
                      "settings": {"profile": "default", "seed": 0}, "checks": checks}]}


CHECKS = [
    {"id": "softmax.differential", "status": "pass", "worst_fraction": 0.25},
    {"id": "layer_norm.differential", "status": "fail", "worst_fraction": 3.5,
     "detail": "max |diff| 1e-3 > budget", "minimal_example": "x = [[1.0, 2.0]]"},
    {"id": "block_post_ln.differential", "status": "not-applicable", "worst_fraction": None},
    {"id": "train_loop.differential", "status": "not-implemented", "worst_fraction": None},
]


def _page(tmp_path: Path, adjudications: str) -> str:
    folder = tmp_path / "ecosystem"
    folder.mkdir()
    (folder / "eng-float32.json").write_text(json.dumps(_report("eng", "float32", CHECKS)))
    table = tmp_path / "adj.toml"
    table.write_text(adjudications)
    engines = [Engine("eng", ("float32", "bfloat16"), "", "An engine under test"),
               Engine("other", ("float32",), "", "Another engine")]
    area_of = {"softmax.differential": "forward", "layer_norm.differential": "forward",
               "block_post_ln.differential": "forward", "train_loop.differential": "training"}
    return compatibility.compatibility_page(
        compatibility.load_runs(folder), engines, ecosystem.load_adjudications(table),
        ecosystem.VERDICTS, area_of)


def test_the_page_shows_counts_per_area_provenance_and_each_adjudicated_failure(tmp_path):
    adjudication = textwrap.dedent('''
        [[adjudication]]
        engine = "eng"
        check = "layer_norm.differential"
        dtypes = ["float32"]
        verdict = "spec-reading"
        reason = "The engine divides by n - 1."
        smallest_input = "x = [[0.0, 1.0]]"
    ''')
    page = _page(tmp_path, adjudication)
    # forward: 1 pass, 1 fail, 1 not applicable, 0 not implemented; worst 350%
    assert ("<td>forward</td><td>1</td><td><span class=\"gs-status gs-fail\">1</span></td>"
            "<td><span class=\"gs-status gs-not-applicable\">1</span></td><td>0</td>") in page
    assert "<td>350%</td>" in page
    assert "<td>training</td><td>0</td><td>0</td><td>0</td>" in page
    assert "eng 1.2.3" in page and "commit 0123456789" in page and "Test CPU 9000 (7 logical" in page
    assert "2026-01-02 03:04 UTC" in page and "profile default, seed 0" in page
    assert "The engine divides by n - 1." in page and "x = [[0.0, 1.0]]" in page
    assert "reads differently" in page and "x = [[1.0, 2.0]]" in page
    assert "Not yet run in bfloat16" in page and "## other" in page


def test_the_page_refuses_a_failure_without_an_adjudication(tmp_path: Path):
    other_dtype = ADJUDICATION.replace("broken-softmax", "eng").replace(
        "softmax.differential", "layer_norm.differential") + 'dtypes = ["bfloat16"]\n'
    with pytest.raises(compatibility.CompatibilityError,
                       match="eng float32 fails layer_norm.differential and no adjudication"):
        _page(tmp_path, other_dtype)


def test_every_committed_report_is_readable_and_every_failure_adjudicated():
    folder = ROOT / ecosystem.REPORT_DIR
    table = ecosystem.load_adjudications(ROOT / ecosystem.ADJUDICATIONS)
    reports = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    assert ecosystem.unexplained(reports, table) == []
    compatibility.load_runs(folder)
    names = {e.backend for e in ecosystem.ENGINES}
    assert all(a.engine in names for a in table), "an adjudication names no engine of the table"


def test_the_guides_smallest_adapter_runs_through_the_suite():
    """The logits-only adapter of docs/backend.md, exactly as printed, at the quick profile:
    the whole-model checks pass, post-LN configurations are skipped as not applicable, and
    an operation it does not bring is reported as not implemented."""
    from gptspec.conformance.runner import run_suite

    text = (ROOT / "docs" / "backend.md").read_text(encoding="utf-8")
    block = text.split("<!-- gptspec:logits-only-example -->\n```python\n", 1)[1]
    namespace: dict = {}
    exec(compile(block.split("\n```", 1)[0], "backend.md", "exec"), namespace)
    backend = namespace["LogitsOnly"]()
    wanted = {"gpt_forward.differential", "model.batch_independence", "softmax.differential"}
    suite = run_suite(backend, profile="quick", area="forward", select=lambda c: c.id in wanted)
    status = {r.id: r for r in suite.results}
    assert status["gpt_forward.differential"].status == "pass"
    assert status["model.batch_independence"].status == "pass"
    assert status["softmax.differential"].status == "not-implemented"
    assert status["gpt_forward.differential"].not_applicable > 0  # post-LN, Guide: skipped


def _judged_on_thirty_checks(engine: str, dtypes: tuple[str, ...]) -> None:
    """The engine's committed default-profile reports: in each dtype at least 30 checks
    reach a verdict (not "not implemented" or "not applicable"), and none fails."""
    for dtype in dtypes:
        path = ROOT / ecosystem.REPORT_DIR / ecosystem.report_name(engine, dtype)
        (run,) = json.loads(path.read_text(encoding="utf-8"))["runs"]
        assert run["settings"]["profile"] == "default"
        statuses = [c["status"] for c in run["checks"]]
        judged = [s for s in statuses if s not in ("not-implemented", "not-applicable")]
        assert len(judged) >= 30, (engine, dtype, len(judged))
        assert set(judged) == {"pass"}, (engine, dtype, sorted(set(judged)))


def test_a_logits_only_engine_nobody_here_wrote_is_judged_on_thirty_checks():
    """transformers' GPT-2 behind forward alone (hf-logits), in float32 and bfloat16."""
    _judged_on_thirty_checks("hf-logits", ("float32", "bfloat16"))


def test_transformers_exported_to_onnx_is_judged_on_thirty_checks():
    """transformers' GPT-2 exported by torch.onnx and run by ONNX Runtime (hf-onnx), in
    each dtype it computes in; bfloat16 it declines."""
    engine = next(e for e in ecosystem.ENGINES if e.backend == "hf-onnx")
    assert engine.dtypes == ("float32", "float16")
    _judged_on_thirty_checks("hf-onnx", engine.dtypes)
