"""Capabilities (a backend declares the areas it implements) and the independent
implementations of gptspec.adapters.tokenizer_engines and optimizer_engines: each passes
the checks of its area that its engine computes as the spec does, and each difference
adjudicated in docs/ecosystem/adjudications.toml is pinned here at its smallest input, so
an adjudication that stops being true fails a test."""

from __future__ import annotations

import numpy as np
import pytest

from gptspec.conformance import protocol
from gptspec.conformance.discovery import BackendError, load_backend
from gptspec.conformance.protocol import NotApplicable
from gptspec.conformance.registry import CHECKS, all_checks
from gptspec.conformance.runner import run_suite
from gptspec.reference import tokenizer as ref


def _statuses(backend, ids, profile="quick", dtype=None):
    all_checks()
    suite = run_suite(backend, profile=profile, area=None, select=lambda c: c.id in ids,
                      dtype=dtype)
    return {r.id: r for r in suite.results}


# --- capabilities --------------------------------------------------------------------------


def test_each_check_needs_the_areas_of_its_operations():
    all_checks()
    assert CHECKS["gpt_forward.differential"].needs == ("model",)
    assert CHECKS["softmax.differential"].needs == ("model",)
    assert CHECKS["decode.round_trip"].needs == ("tokenizer",)
    assert CHECKS["adamw_step.trajectory"].needs == ("optimizer",)
    assert CHECKS["lr_schedule.differential"].needs == ("schedule",)
    assert CHECKS["sampling_distribution.differential"].needs == ("sampling",)
    assert CHECKS["generate.greedy_reference"].needs == ("model", "sampling")
    assert set(CHECKS["train_loop.matches_reference"].needs) == {
        "model", "gradients", "optimizer", "schedule"}
    assert {a for c in CHECKS.values() for a in c.needs} == set(protocol.CAPABILITIES)


class _TokenizerOnly:
    """A tokenizer backend with no forward (tiktoken's, declared as such)."""

    protocol_version = protocol.PROTOCOL_VERSION
    name, version, device, dtype = "tok-only", "0", "cpu", "float64"
    capabilities = ("tokenizer",)

    def tokenizer(self):
        from gptspec.adapters.tokenizer_engines import TiktokenBackend

        return TiktokenBackend()


class _NoForward(_TokenizerOnly):
    capabilities = ("tokenizer", "model")


class _Unknown(_TokenizerOnly):
    capabilities = ("tokenizer", "modle")


class _OnePass(_TokenizerOnly):
    capabilities = (area for area in ("tokenizer",))  # type: ignore[assignment]


class _RaisingIteration:
    def __iter__(self):
        raise RuntimeError("no iteration today")


class _CapabilitiesRaise(_TokenizerOnly):
    capabilities = _RaisingIteration()  # type: ignore[assignment]


class _Legacy:
    """A backend written before capabilities: forward plus a softmax."""

    protocol_version = protocol.PROTOCOL_VERSION
    name, version, device, dtype = "legacy", "0", "cpu", "float64"

    def forward(self, tokens, params, config):
        from gptspec.reference import gpt_forward

        return gpt_forward(tokens, params, config)

    def softmax(self, z, axis=-1):
        from gptspec.reference import softmax

        return softmax(z, axis=axis)


def test_a_tokenizer_only_backend_needs_no_forward_and_its_other_areas_are_not_implemented():
    backend = load_backend(f"{__name__}:_TokenizerOnly")
    status = _statuses(backend, {"gpt_forward.differential", "decode.round_trip",
                                 "adamw_step.trajectory", "train.matches_reference"})
    assert status["decode.round_trip"].status == "pass"
    assert status["train.matches_reference"].status == "not-applicable"  # tiktoken: no trainer
    for check in ("gpt_forward.differential", "adamw_step.trajectory"):
        assert status[check].status == "not-implemented"
        assert "does not implement the" in status[check].detail
        assert "(it declares tokenizer)" in status[check].detail


def test_a_declared_model_needs_forward_and_unknown_areas_are_refused():
    with pytest.raises(BackendError, match="lacks forward"):
        load_backend(f"{__name__}:_NoForward")
    with pytest.raises(BackendError, match="unknown areas 'modle'"):
        load_backend(f"{__name__}:_Unknown")
    # handed to run_suite directly, every check says so (never a silent pass)
    status = _statuses(_Unknown(), {"decode.round_trip"})
    assert status["decode.round_trip"].status == "error"
    assert "unknown areas" in status["decode.round_trip"].detail


def test_capabilities_that_read_once_or_raise_are_refused_in_one_line():
    # a generator was read empty by the checks ("declares no area", in-process) and whole
    # by the worker's discovery (passed, isolated); an __iter__ that raised was the
    # command's own error with --no-isolate
    with pytest.raises(BackendError, match="not an iterator that reads once"):
        load_backend(f"{__name__}:_OnePass")
    with pytest.raises(BackendError, match="iterating it raised RuntimeError: no iteration"):
        load_backend(f"{__name__}:_CapabilitiesRaise")


def test_a_backend_declaring_no_capabilities_reads_as_before():
    backend = load_backend(f"{__name__}:_Legacy")
    status = _statuses(backend, {"softmax.differential", "layer_norm.differential",
                                 "decode.round_trip"})
    assert status["softmax.differential"].status == "pass"
    assert status["layer_norm.differential"].detail == "backend has no operation layer_norm"
    assert status["decode.round_trip"].detail == "backend has no operation tokenizer"


# --- tokenizers ----------------------------------------------------------------------------

TOKENIZER_CHECKS = {"decode.round_trip", "encode.matches_reference", "bpe_chunk.rank_order",
                    "split_special.allowed_and_disallowed", "decode.out_of_range",
                    "decode.invalid_utf8", "token_bytes.concatenation"}


def test_tiktoken_passes_every_tokenizer_check_it_can_run():
    from gptspec.adapters.tokenizer_engines import TiktokenBackend

    status = _statuses(TiktokenBackend(), TOKENIZER_CHECKS | {"train.matches_reference"})
    assert {k: v.status for k, v in status.items() if k in TOKENIZER_CHECKS} == {
        k: "pass" for k in TOKENIZER_CHECKS}
    assert status["train.matches_reference"].status == "not-applicable"


def test_tiktoken_declares_merges_it_cannot_hold_not_applicable():
    """tiktoken ranks a pair by the bytes it spells: [(a, b), (b, c), (a, bc)] would make it
    encode "abc" as [258], where the spec gives [256, 99]; the adapter says so at build."""
    import tiktoken

    from gptspec.adapters.tokenizer_engines import TiktokenBackend

    untaught = [(97, 98), (98, 99), (97, 257)]
    assert ref.encode("abc", untaught, ref.GPT2_PATTERN) == [256, 99]
    spelled = {bytes([b]): b for b in range(256)} | {b"ab": 256, b"bc": 257, b"abc": 258}
    raw = tiktoken.Encoding("raw", pat_str=ref.GPT2_PATTERN, mergeable_ranks=spelled,
                            special_tokens={})
    assert raw.encode("abc") == [258]  # what the engine would compute
    with pytest.raises(NotApplicable, match="byte-ranked BPE"):
        TiktokenBackend().build(untaught, ref.GPT2_PATTERN, {})
    learned = ref.train("abc abc abd", 260, ref.GPT2_PATTERN)
    assert TiktokenBackend().build(learned, ref.GPT2_PATTERN, {}).encode("abc abd") == \
        ref.encode("abc abd", learned, ref.GPT2_PATTERN)


def test_hf_tokenizers_passes_where_it_computes_the_spec():
    from gptspec.adapters.tokenizer_engines import HFTokenizersBackend

    same = TOKENIZER_CHECKS - {"encode.matches_reference", "decode.out_of_range"}
    status = _statuses(HFTokenizersBackend(), same)
    assert {k: v.status for k, v in status.items()} == {k: "pass" for k in same}


def test_hf_tokenizers_differences_at_their_smallest_inputs():
    """The three adjudicated differences (docs/ecosystem/adjudications.toml)."""
    from tokenizers import Regex, pre_tokenizers

    from gptspec.adapters.tokenizer_engines import HFTokenizersBackend

    hf = HFTokenizersBackend()
    # ties in training: the spec takes the smallest pair of byte ids, HF its own order
    assert ref.train(" aa", 257) == [(32, 97)]
    assert hf.train(" aa", 257, ref.GPT2_PATTERN) == [(97, 97)]
    # an id past the vocabulary decodes to nothing instead of an error
    assert hf.build([], ref.GPT2_PATTERN, {}).decode([65, 256]) == "A"
    # Oniguruma reads the cl100k pattern's possessive {1,3}+ as a repetition
    split = pre_tokenizers.Split(Regex(ref.CL100K_PATTERN), behavior="isolated")
    assert [s for s, _ in split.pre_tokenize_str("0002")] == ["0002"]
    assert ref.pretokenize("0002", ref.CL100K_PATTERN) == ["000", "2"]
    assert hf.build([(48, 50)], ref.CL100K_PATTERN, {}).encode("0002") == [48, 48, 256]
    assert ref.encode("0002", [(48, 50)], ref.CL100K_PATTERN) == [48, 48, 48, 50]


# --- optimizers and schedules --------------------------------------------------------------


@pytest.mark.parametrize("name", ["TorchAdamWForeach", "TorchAdamWFused", "OptaxAdamW"])
def test_adamw_of_torch_and_optax_passes_the_trajectory_check(name):
    from gptspec.adapters import optimizer_engines

    backend = getattr(optimizer_engines, name)(dtype="float32")
    status = _statuses(backend, {"adamw_step.trajectory", "gpt_forward.differential"},
                       dtype="float32")
    assert status["adamw_step.trajectory"].status == "pass"
    assert status["gpt_forward.differential"].status == "not-implemented"


def test_a_wrong_adamw_fails_the_trajectory_check():
    """The check sees the engine's arithmetic: torch's AdamW with its decay coupled into the
    gradient (torch.optim.Adam's weight_decay, L2 not AdamW) fails it."""
    import torch

    from gptspec.adapters import optimizer_engines

    class CoupledDecay(optimizer_engines.TorchAdamWForeach):
        def adamw_trajectory(self, params, grads, lrs, beta1, beta2, eps, weight_decay):
            original = torch.optim.AdamW
            torch.optim.AdamW = torch.optim.Adam  # type: ignore[misc]
            try:
                return super().adamw_trajectory(params, grads, lrs, beta1, beta2, eps,
                                                weight_decay)
            finally:
                torch.optim.AdamW = original  # type: ignore[misc]

    status = _statuses(CoupledDecay(dtype="float32"), {"adamw_step.trajectory"},
                       dtype="float32")
    assert status["adamw_step.trajectory"].status == "fail"


def test_optax_clipping_has_no_epsilon():
    """Adjudicated: optax.clip_by_global_norm scales by c/‖g‖, the spec by c/(‖g‖ + 10⁻⁶)."""
    from gptspec.adapters.optimizer_engines import OptaxAdamW
    from gptspec.reference import clip_grad_norm

    got, _ = OptaxAdamW(dtype="float32").clip_grad_norm({"p0": np.array([[0.1]])}, 0.05)
    expected, _ = clip_grad_norm({"p0": np.array([[0.1]])}, 0.05)
    assert got["p0"][0, 0] == np.float32(0.05)
    assert expected["p0"][0, 0] == pytest.approx(0.1 * 0.05 / (0.1 + 1e-6), rel=1e-12)


def test_torch_schedulers_chained_pass_the_schedule_check():
    from gptspec.adapters.optimizer_engines import TorchLRScheduler

    status = _statuses(TorchLRScheduler(), {"lr_schedule.differential"}, dtype="float32")
    assert status["lr_schedule.differential"].status == "pass"


def test_transformers_warm_up_starts_at_zero():
    """Adjudicated: transformers' warm-up is η_max·s/W (0 at step 0), the spec's
    η_max·(s + 1)/W."""
    from gptspec.adapters.optimizer_engines import TransformersSchedule
    from gptspec.reference import lr_schedule

    hf = TransformersSchedule()
    assert hf.lr_schedule(0, 1.0, 0.0, 1, 2) == 0.0
    assert lr_schedule(0, 1.0, 0.0, 1, 2) == 1.0


def test_the_ecosystem_lists_six_independent_implementations_across_four_areas():
    from gptspec.adapters import ecosystem

    independent = [e for e in ecosystem.ENGINES if e.independent]
    assert len(independent) >= 6
    assert len({a for e in independent for a in e.areas}) >= 4
    assert {e.backend for e in ecosystem.ENGINES if not e.independent} == {"jax", "onnxruntime"}


# --- transformers' GPT-2 modules -----------------------------------------------------------


def test_transformers_modules_and_gradients_pass_in_float32():
    from gptspec.adapters.transformers import EagerBackend

    ids = {"gelu_tanh.differential", "layer_norm.differential", "ffn_gelu_tanh.differential",
           "gpt_backward.differential"}
    status = _statuses(EagerBackend(dtype="float32"), ids, dtype="float32")
    assert {k: v.status for k, v in status.items()} == {k: "pass" for k in ids}


GPT2_MODULE_CHECKS = {"multi_head_attention.differential", "block_pre_ln.differential",
                      "scaled_dot_product_attention.differential", "linear.differential",
                      "gelu.differential", "relu.differential", "ffn_gelu.differential",
                      "ffn_relu.differential", "token_embedding.differential",
                      "positional_embedding.differential", "unembed_tied.differential",
                      "unembed_untied.differential"}


@pytest.mark.parametrize("name", ["EagerBackend", "SdpaBackend"])
def test_transformers_attention_and_block_modules_pass_in_float32(name):
    """GPT2Attention, GPT2Block, the attention function, Conv1D, GPT2MLP's other
    activations, wte, wpe and lm_head, each GPT-2's own module holding the drawn weights."""
    from gptspec.adapters import transformers as hf

    status = _statuses(getattr(hf, name)(dtype="float32"), GPT2_MODULE_CHECKS, dtype="float32")
    assert {k: v.status for k, v in status.items()} == {k: "pass" for k in GPT2_MODULE_CHECKS}


def test_transformers_attention_module_refuses_what_gpt2_cannot_express():
    from gptspec.adapters.transformers import EagerBackend

    backend, rng = EagerBackend(dtype="float32"), np.random.default_rng(0)
    H, W, W_O = rng.normal(size=(3, 4)), rng.normal(size=(4, 12)), rng.normal(size=(4, 4))
    with pytest.raises(protocol.NotApplicable, match="without biases"):
        backend.multi_head_attention(H, W, None, W_O, None, 2)
    with pytest.raises(protocol.NotApplicable, match="n_embd / n_head"):  # d_k = 3, not 4/2
        backend.multi_head_attention(H, rng.normal(size=(4, 18)), np.zeros(18),
                                     rng.normal(size=(6, 4)), np.zeros(4), 2)


def _planted(kind):
    """The EagerBackend with a bug an adapter author could make: c_proj's bias left at zero,
    or GPT2Attention called alone, without the causal mask GPT2Model builds for it (eager
    attention then attends to every position)."""
    from gptspec.adapters.transformers import EagerBackend

    class Planted(EagerBackend):
        def multi_head_attention(self, H, W_qkv, b_qkv, W_O, b_O, n_heads):
            if kind == "drops b_O" and b_O is not None:
                b_O = np.zeros_like(b_O)
            return super().multi_head_attention(H, W_qkv, b_qkv, W_O, b_O, n_heads)

        def _sequences(self, module, hf_config, H):
            if kind != "no causal mask":
                return super()._sequences(module, hf_config, H)
            x = self._tensor(H)
            out = module(x.reshape(-1, *x.shape[-2:]), attention_mask=None)
            return (out[0] if isinstance(out, tuple) else out).reshape(x.shape).double().numpy()

    return Planted(dtype="float32")


@pytest.mark.parametrize("kind", ["drops b_O", "no causal mask"])
def test_a_planted_bug_in_the_transformers_attention_fails_its_check(kind):
    backend = _planted(kind)
    status = _statuses(backend, {"multi_head_attention.differential"}, dtype="float32")
    assert status["multi_head_attention.differential"].status == "fail"
    if kind == "no causal mask":  # the block's own attention too (run alone: not blocked)
        status = _statuses(backend, {"block_pre_ln.differential"}, dtype="float32")
        assert status["block_pre_ln.differential"].status == "fail"


def test_transformers_gelu_new_cancels_in_bfloat16():
    """Adjudicated: gelu_new evaluated op by op in bfloat16 loses the negative tail, where
    1 + tanh(·) cancels (x = −4: 0 instead of −7.0e-5)."""
    from gptspec.adapters.transformers import EagerBackend
    from gptspec.reference import gelu_tanh

    got = EagerBackend(dtype="bfloat16").gelu_tanh(np.array([-4.0, -3.0]))
    assert got[0] == 0.0 and gelu_tanh(np.array([-4.0]))[0] == pytest.approx(-7.0246e-5, 1e-3)
    assert got[1] == -0.005859375 and gelu_tanh(np.array([-3.0]))[0] == pytest.approx(-0.0036374,
                                                                                         1e-4)


# --- transformers' GPT-2 exported by torch.onnx, run by ONNX Runtime (hf-onnx) --------------


def _small_gpt2(tied):
    from gptspec.spec.config import GPTConfig
    from gptspec.spec.parameters import parameter_schema

    config = GPTConfig(vocab_size=37, n_ctx=9, d_model=12, n_layers=2, n_heads=3, d_ff=20,
                       tied_embeddings=tied)
    rng = np.random.default_rng(1)
    params = {s.name: rng.normal(size=s.shape) for s in parameter_schema(config)}
    return config, params, rng.integers(0, 37, size=(2, 7))


@pytest.mark.parametrize("tied", [True, False])
def test_hf_onnx_logits_are_transformers_own_within_float32_roundoff(tied):
    """The exported graph run by ONNX Runtime gives transformers' own float32 logits (those
    of GPT2LMHeadModel in torch) to float32 roundoff, with new weights bound to one export."""
    from gptspec.adapters.transformers import SdpaBackend
    from gptspec.adapters.transformers_onnx import TransformersOnnxBackend

    config, params, tokens = _small_gpt2(tied)
    backend, hf = TransformersOnnxBackend(), SdpaBackend()
    for scale in (1.0, 0.5):  # a second set of weights: the same export, rebound
        weights = {k: scale * v for k, v in params.items()}
        got, want = backend.forward(tokens, weights, config), hf.forward(tokens, weights, config)
        assert got.shape == (2, 7, 37) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())
    assert len(backend._exports) == 1
    np.testing.assert_array_equal(backend.forward(tokens[:1, :3], params, config),
                                  backend.forward(tokens[:, :3], params, config)[:1])


def test_hf_onnx_declines_what_it_cannot_compute():
    from gptspec.adapters.transformers_onnx import TransformersOnnxBackend

    with pytest.raises(protocol.NotApplicable, match="no bfloat16 kernel"):
        TransformersOnnxBackend(dtype="bfloat16")
    assert TransformersOnnxBackend(dtype="float16").dtype == "float16"
    config, _, _ = _small_gpt2(True)
    assert "pre-LN" in TransformersOnnxBackend.supports(config.replace(norm="post"))
    assert TransformersOnnxBackend.supports(config) is None


def test_a_dropped_layer_norm_bias_in_the_exported_graph_fails_the_model_check():
    """A planted bug in the exported graph's initializers: every ln_1 bias left at zero."""
    from gptspec.adapters.transformers_onnx import TransformersOnnxBackend

    class Planted(TransformersOnnxBackend):
        def weights(self, params, config):
            out = super().weights(params, config)
            return {k: np.zeros_like(v) if k.endswith("ln_1.bias") else v
                    for k, v in out.items()}

    status = _statuses(Planted(), {"gpt_forward.differential"}, dtype="float32")
    assert status["gpt_forward.differential"].status == "fail"
    status = _statuses(TransformersOnnxBackend(), {"gpt_forward.differential"}, dtype="float32")
    assert status["gpt_forward.differential"].status == "pass"
