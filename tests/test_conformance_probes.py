"""The probes: forward-area entries judged through ``forward`` alone. A correct backend
passes them; a planted bug behind a logits-only wrapper fails them, and the report names
the entry it breaks."""

from __future__ import annotations

import pytest

from gptspec.conformance import report
from gptspec.conformance.checks_probes import PROBES, localise
from gptspec.conformance.registry import all_checks
from gptspec.conformance.runner import SuiteResult, run_suite
from gptspec.reference.backend import ReferenceBackend
from meta.keyhole import LogitsOnly
from meta.mutants import BY_NAME

FORWARD_ALONE = [c.id for c in all_checks("forward") if not c.ops]


def test_at_least_thirty_forward_area_checks_need_nothing_but_forward():
    assert len(FORWARD_ALONE) >= 30
    assert {f"probe.{e}" for e in PROBES} <= set(FORWARD_ALONE)


def test_every_probe_holds_what_it_names_in_its_support():
    for probe in PROBES.values():
        assert probe.entry in probe.entries and set(probe.entries) <= probe.support
        assert "gpt_forward" in probe.support or probe.entry == "layer_norm"


def test_a_lone_failing_probe_points_at_its_own_entry():
    outcomes = {e: e != "unembed_untied" for e in PROBES}
    assert localise(outcomes)[0] == "unembed_untied"
    assert localise({e: True for e in PROBES}) == []


def test_a_non_finite_result_also_points_at_the_sublayers_its_probe_silenced():
    # token_embedding's probe silences attention by W_O = 0, which a NaN passes through
    outcomes = {e: e not in ("token_embedding", "causal_mask") for e in PROBES}
    assert localise(outcomes) == ["token_embedding / one_hot / token_embedding_one_hot"]
    assert localise(outcomes, nonfinite={"token_embedding"})[0] == "causal_mask"


def test_entries_the_probes_cannot_tell_apart_are_one_suspect():
    outcomes = {e: e != "softmax" for e in PROBES}
    assert localise(outcomes)[0] == "softmax / softmax_shifted"


def test_the_reference_passes_every_probe_through_forward_alone():
    suite = run_suite(LogitsOnly(ReferenceBackend()), profile="quick",
                      select=lambda c: c.id.startswith("probe."))
    assert suite.counts["pass"] == len(PROBES) + 2  # the probes and the two properties
    assert report.localisation(suite) is None


@pytest.mark.parametrize("mutant, entry", [("layer_norm_eps_outside_root", "layer_norm"),
                                           ("final_layer_norm_skipped", "final_layer_norm"),
                                           ("exact_gelu_where_tanh_configured", "gelu_tanh"),
                                           ("linear_bias_dropped", "linear"),
                                           ("qkv_k_v_swapped", "qkv_projection")])
def test_a_bug_behind_a_logits_only_wrapper_is_found_and_named(mutant, entry):
    backend = LogitsOnly(BY_NAME[mutant].backend())
    assert not hasattr(backend, "layer_norm")  # nothing but forward is exposed
    suite = run_suite(backend, profile="quick", select=lambda c: c.id.startswith("probe."))
    assert suite.counts["fail"] + suite.counts["error"] > 0
    found = report.localisation(suite)
    # named first, or in a tie of two (the activation and its FFN fail together)
    assert found is not None, suite
    suspects = [set(s.split(" / ")) for s in found["suspects"]]  # "a / b": equal forms
    assert entry in suspects[0] or (len(suspects) <= 2 and entry in set().union(*suspects)), found
    assert "the probes point at:" in report.summary(suite)
    assert report.to_json([suite])["runs"][0]["localisation"] == found


class ExpressesOnlyGPT2:
    """The reference behind forward, refusing what GPT-2's fixed architecture cannot hold
    (as transformers' adapter does): every bias on, learned positions, pre-LN."""

    protocol_version, name, version, device, dtype = 2, "gpt2-shaped", "1", "cpu", "float64"

    def forward(self, tokens, params, config):
        assert self.supports(config) is None
        return ReferenceBackend().forward(tokens, params, config)

    @staticmethod
    def supports(config):
        if not (config.attn_bias and config.ffn_bias and config.positional_embedding):
            return "GPT-2 has biases and learned positions"
        return "GPT-2 is pre-LN" if config.norm != "pre" else None


def test_a_probe_fits_its_model_to_what_a_narrow_engine_can_express():
    suite = run_suite(ExpressesOnlyGPT2(), profile="quick",
                      select=lambda c: c.id.startswith("probe."))
    by_id = {r.id: r.status for r in suite.results}
    # the same function with zero biases and W_P = 0: judged, not skipped
    assert by_id["probe.token_embedding"] == by_id["probe.relu"] == "pass"
    assert by_id["probe.causal_mask"] == by_id["probe.positions_absent"] == "pass"
    # a post-LN or Guide block has no equal in a pre-LN engine
    assert by_id["probe.layer_norm"] == by_id["probe.block_guide"] == "not-applicable"


class RaisesUnlessDefaultEps:
    """A correct engine that raises (a limitation, not a wrong result) for any ε but 1e-5."""

    protocol_version, name, version, device, dtype = 2, "fixed-eps", "1", "cpu", "float64"

    def forward(self, tokens, params, config):
        if config.ln_eps != 1e-5:
            raise RuntimeError("this engine's LayerNorm has a fixed epsilon")
        return ReferenceBackend().forward(tokens, params, config)


def test_probes_that_erred_point_at_nothing():
    suite = run_suite(RaisesUnlessDefaultEps(), profile="quick",
                      select=lambda c: c.id.startswith("probe."))
    assert suite.counts["error"] > 0 and suite.counts["fail"] == 0, suite.counts
    assert report.localisation(suite) is None
    assert "point at" not in report.summary(suite)
    assert "localisation" not in report.to_json([suite])["runs"][0]


def test_only_failed_probes_are_evidence_not_erring_ones():
    suite = run_suite(LogitsOnly(ReferenceBackend()), profile="quick",
                      select=lambda c: c.id.startswith("probe."))
    failed = "probe.unembed_untied"
    erred = {"probe.layer_norm", "probe.token_embedding", "probe.causal_mask"}
    for r in suite.results:
        r.status = "fail" if r.id == failed else "error" if r.id in erred else r.status
    found = report.localisation(suite)
    assert found is not None and found["suspects"][0] == "unembed_untied", found
    assert found["smallest_failing_probe"] == failed
    without = SuiteResult(suite.backend, suite.settings,
                          [r for r in suite.results if r.id not in erred])
    assert report.localisation(without) == found
