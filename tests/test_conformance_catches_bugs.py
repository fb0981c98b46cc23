"""A check that cannot catch a planted bug is not a check.

Each case plants one realistic bug in the float64 reference backend and asserts that
the named check fails (and that the honest backend passes the same check). The whole
suite's run against the honest reference and torch backends is in test_conformance.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from gptspec import reference as ref
from gptspec.conformance.registry import all_checks
from gptspec.conformance.runner import run_suite
from gptspec.reference.backend import ReferenceBackend


def _run(backend, *ids):
    suite = run_suite(backend, profile="quick", seed=0, select=lambda c: c.id in ids)
    return {r.id: r for r in suite.results}


class SoftmaxWithoutShift(ReferenceBackend):
    def softmax(self, z, axis=-1):
        e = np.exp(np.asarray(z, dtype=np.float64))
        return e / e.sum(axis=axis, keepdims=True)


class MaskShiftedByOne(ReferenceBackend):
    def causal_mask(self, T):
        M = np.zeros((T, T))
        M[np.triu_indices(T, k=2)] = -np.inf
        return M


class ScoresWithoutScale(ReferenceBackend):
    def attention_scores(self, Q, K, M):
        return np.asarray(Q) @ np.asarray(K).swapaxes(-1, -2) + M


class ScoresScaledTwice(ReferenceBackend):
    def attention_scores(self, Q, K, M):
        return np.asarray(Q) @ np.asarray(K).swapaxes(-1, -2) / np.shape(Q)[-1] + M


class LayerNormUnbiased(ReferenceBackend):
    def layer_norm(self, x, gamma, beta, eps):
        x = np.asarray(x, dtype=np.float64)
        mu = x.mean(-1, keepdims=True)
        n = x.shape[-1]
        var = ((x - mu) ** 2).sum(-1, keepdims=True) / max(n - 1, 1)  # Bessel-corrected
        return gamma * (x - mu) / np.sqrt(var + eps) + beta


class LayerNormEpsOutsideRoot(ReferenceBackend):
    def layer_norm(self, x, gamma, beta, eps):
        x = np.asarray(x, dtype=np.float64)
        mu = x.mean(-1, keepdims=True)
        return gamma * (x - mu) / (np.sqrt(x.var(-1, keepdims=True)) + eps) + beta


class ExactGeluForTanh(ReferenceBackend):
    def gelu_tanh(self, x):
        return ref.gelu(x)


class HeadsWithoutTranspose(ReferenceBackend):
    def split_heads(self, X, n_heads):
        X = np.asarray(X, dtype=np.float64)
        *lead, T, d = X.shape
        return X.reshape(*lead, n_heads, T, d // n_heads)


class PositionsOffByOne(ReferenceBackend):
    def forward(self, tokens, params, config):
        shifted = dict(params)
        shifted["wpe"] = np.roll(params["wpe"], -1, axis=0)
        return ref.gpt_forward(tokens, shifted, config)


class NoCausalMask(ReferenceBackend):
    def forward(self, tokens, params, config):
        original = ref.forward.causal_mask
        ref.forward.causal_mask = lambda T: np.zeros((T, T))
        try:
            return ref.gpt_forward(tokens, params, config)
        finally:
            ref.forward.causal_mask = original


class BatchDependent(ReferenceBackend):
    def forward(self, tokens, params, config):
        logits = ref.gpt_forward(tokens, params, config)
        return logits - 1e-3 * logits.mean(axis=0, keepdims=True)  # leaks across the batch


class HeadSumMissingOneHead(ReferenceBackend):
    def multi_head_attention_head_sum(self, H, W_qkv, b_qkv, W_O, b_O, n_heads):
        W_O = np.array(W_O, dtype=np.float64)
        W_O[: W_O.shape[0] // n_heads] = 0  # head 1 never reaches the stream
        return ref.multi_head_attention_head_sum(H, W_qkv, b_qkv, W_O, b_O, n_heads)


class ResidualDropped(ReferenceBackend):
    def block_pre_ln(self, H, p, config):
        return ref.block_pre_ln(H, p, config) - np.asarray(H)  # forgot "+ H"


class FinalLayerNormOwnEps(ReferenceBackend):
    def final_layer_norm(self, H, gamma, beta, eps):
        return ref.layer_norm(H, gamma, beta, 1e-5)  # nn.LayerNorm's default, not the config's


class UnembedWithoutTranspose(ReferenceBackend):
    def unembed_tied(self, H, W_E):
        W_E = np.asarray(W_E)
        H = np.asarray(H)
        return H @ W_E[: H.shape[-1]] if W_E.shape[0] >= H.shape[-1] else H @ W_E.T * 1.5


PLANTED = [
    (SoftmaxWithoutShift, "softmax.stability"),
    (MaskShiftedByOne, "causal_mask.differential"),
    (ScoresWithoutScale, "attention_scores.differential"),
    (ScoresScaledTwice, "attention_scores.differential"),
    (LayerNormUnbiased, "layer_norm.differential"),
    (LayerNormEpsOutsideRoot, "layer_norm.differential"),
    (ExactGeluForTanh, "gelu_tanh.differential"),
    (HeadsWithoutTranspose, "split_heads.differential"),
    (PositionsOffByOne, "gpt_forward.differential"),
    (NoCausalMask, "causal_mask.causality"),
    (BatchDependent, "model.batch_independence"),
    (HeadSumMissingOneHead, "attention.head_sum"),
    (ResidualDropped, "residual.identity"),
    (UnembedWithoutTranspose, "embedding.round_trip"),
    (FinalLayerNormOwnEps, "final_layer_norm.differential"),
]


@pytest.mark.parametrize("backend_class, check_id", PLANTED,
                         ids=[f"{c.__name__}->{i}" for c, i in PLANTED])
def test_planted_bug_is_caught_by_its_check(backend_class, check_id):
    assert check_id in {c.id for c in all_checks()}
    result = _run(backend_class(), check_id)[check_id]
    assert result.status in ("fail", "error"), (check_id, result.status, result.detail)
    assert result.detail


@pytest.mark.parametrize("check_id", sorted({c for _, c in PLANTED}))
def test_honest_reference_passes_the_checks_that_catch_bugs(check_id):
    result = _run(ReferenceBackend(), check_id)[check_id]
    assert result.status == "pass", result.detail


class Raises(ReferenceBackend):
    def softmax(self, z, axis=-1):
        raise RuntimeError("kernel exploded")


class ReturnsNaN(ReferenceBackend):
    def layer_norm(self, x, gamma, beta, eps):
        return np.full(np.shape(x), math.nan)


class WrongShape(ReferenceBackend):
    def forward(self, tokens, params, config):
        return ref.gpt_forward(tokens, params, config)[:, :-1]


def test_a_backend_that_raises_is_an_error_and_the_run_goes_on():
    results = _run(Raises(), "softmax.differential", "linear.differential")
    assert results["softmax.differential"].status == "error"
    assert "RuntimeError: kernel exploded" in results["softmax.differential"].detail
    assert results["linear.differential"].status == "pass"


def test_nan_fails_with_a_message_naming_it():
    r = _run(ReturnsNaN(), "layer_norm.differential")["layer_norm.differential"]
    assert r.status == "fail" and "NaN" in r.detail


def test_wrong_shape_fails_with_a_message_naming_it():
    r = _run(WrongShape(), "gpt_forward.differential")["gpt_forward.differential"]
    assert r.status == "fail" and "shape" in r.detail


def test_failure_blocks_its_dependents_naming_the_root_cause():
    results = _run(Raises(), "softmax.differential", "attention_weights.differential",
                   "scaled_dot_product_attention.differential",
                   "multi_head_attention.differential")
    assert results["attention_weights.differential"].status == "blocked"
    assert results["attention_weights.differential"].blocked_by == "softmax.differential"
    # blocked transitively: multi-head depends on sdpa, which depends on softmax
    assert results["multi_head_attention.differential"].blocked_by == "softmax.differential"


class ForwardOnly:
    name, version, device, dtype = "forward-only", "0", "cpu", "float64"
    protocol_version = 2

    def forward(self, tokens, params, config):
        return ref.gpt_forward(tokens, params, config)


def test_missing_operations_are_not_implemented_not_crashes():
    suite = run_suite(ForwardOnly(), profile="quick",
                      select=lambda c: c.id in ("softmax.differential", "gpt_forward.differential",
                                                "model.dimensionality"))
    status = {r.id: r.status for r in suite.results}
    assert status == {"softmax.differential": "not-implemented",
                      "gpt_forward.differential": "pass", "model.dimensionality": "pass"}


def test_failing_example_is_reported_minimally_with_a_reproduction():
    suite = run_suite(MaskShiftedByOne(), profile="quick", reproduce="gptspec conformance X",
                      select=lambda c: c.id == "causal_mask.differential")
    (r,) = suite.results
    assert "Falsifying example" in r.minimal_example
    assert r.reproduce.endswith("--check causal_mask.differential --seed 0")


def test_a_temperature_divided_in_16_bit_is_caught_at_a_temperature_not_a_power_of_two(
        monkeypatch):
    """Sampling runs in float32 at least; a backend that divides 16-bit logits by τ in
    their dtype rounds z/τ to 8 bits. At τ = 0.5, 1, 2 (the only temperatures drawn once)
    the quotient is exact and the bug invisible; the check now draws others too."""
    import torch

    from gptspec.fast.backend import TorchBackend
    from gptspec.fast.sampling import sampling_distribution

    class TemperatureIn16Bit(TorchBackend):
        def sampling_distribution(self, z, temperature=1.0, top_k=None, top_p=None):
            z = torch.as_tensor(np.asarray(z), dtype=self.torch_dtype)
            if temperature:
                z, temperature = z / temperature, 1.0  # rounded to the 16-bit dtype
            return self._to_numpy(sampling_distribution(z, temperature, top_k, top_p))

    buggy, honest = TemperatureIn16Bit("cpu", "bfloat16"), TorchBackend("cpu", "bfloat16")
    z = np.asarray(torch.randn(50, generator=torch.Generator().manual_seed(0))
                   .to(torch.bfloat16).double())
    for tau in (0.5, 1.0, 2.0):
        assert np.array_equal(buggy.sampling_distribution(z, tau),
                              honest.sampling_distribution(z, tau))
    assert not np.array_equal(buggy.sampling_distribution(z, 0.7),
                              honest.sampling_distribution(z, 0.7))
    def status(backend):
        suite = run_suite(backend, profile="quick", seed=0, area=None,
                          select=lambda c: c.id == "sampling_distribution.differential")
        return [(r.status, r.detail) for r in suite.results]

    assert status(buggy)[0][0] == "fail"
    assert status(honest)[0][0] == "pass", status(honest)
    from hypothesis import strategies as st

    from gptspec.conformance import checks_sampling

    monkeypatch.setattr(checks_sampling, "TEMPERATURES", st.sampled_from((0.0, 0.5, 1.0, 2.0)))
    assert status(buggy)[0][0] == "pass"  # what the check drew before


# --- the tokenizer ---------------------------------------------------------------------------


class TiktokenWheneverBytesDiffer:
    """The fast tokenizer as it was (hostile round, finding 2): tiktoken encoded whenever
    no two merges spelled the same bytes, though it ranks a pair by the token its bytes
    spell; for [(a, b), (b, c), (a, bc)] it gave [258] for "abc", the spec [256, 99]."""

    @staticmethod
    def backend():
        import tiktoken

        from gptspec.fast.tokenizer import GPT2_NO_LOOKAHEAD, FastTokenizerBackend

        class Backend(FastTokenizerBackend):
            def build(self, merges, pattern, special_tokens):
                tok = super().build(merges, pattern, special_tokens)
                ranks = tok.mergeable_ranks()
                if tok._encoding is None and len(ranks) == tok._n_bpe:
                    tok._encoding = tiktoken.Encoding(
                        "by-byte-ranks", pat_str=GPT2_NO_LOOKAHEAD if tok._cut_runs
                        else tok.pattern, mergeable_ranks=ranks, special_tokens={})
                return tok

        return Backend()


def test_encoding_by_byte_ranks_for_untaught_merges_is_caught():
    from gptspec.fast.tokenizer import FastTokenizerBackend

    buggy = TiktokenWheneverBytesDiffer.backend()
    assert buggy.build([(97, 98), (98, 99), (97, 257)], ref.tokenizer.GPT2_PATTERN,
                       {}).encode("abc") == [258]  # the bug is planted
    def encode_check(backend):
        (result,) = run_suite(backend, profile="quick", seed=0, area="tokenizer",
                              select=lambda c: c.id == "encode.matches_reference").results
        return result

    result = encode_check(buggy)
    assert result.status == "fail", (result.status, result.detail)
    assert result.minimal_example
    assert encode_check(FastTokenizerBackend()).status == "pass"
