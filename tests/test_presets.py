"""Each document's model as a preset: its configuration, schema and parameter count, and
its forward pass, shrunk to a small size with the same switches, fast against reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gptspec import reference as ref
from gptspec.conformance import budgets as B
from gptspec.fast.model import GPT
from gptspec.spec import PRESETS, GPTConfig, parameter_count, parameter_schema
from gptspec.spec.config import GPT3_TABLE, PRESET_DECISIONS
from gptspec.spec.equation import Decision


def shrunk(config: GPTConfig) -> GPTConfig:
    """The same model at a size the reference runs in milliseconds: every switch kept, and
    a free head width kept free (h·d_H ≠ d_model) where the preset has one."""
    d_model, n_heads = 12, 3
    d_head = None if config.head_width_is_derived else 5  # 3·5 = 15 ≠ 12
    return config.replace(vocab_size=41, n_ctx=9, n_layers=2, d_model=d_model,
                          n_heads=n_heads, d_head=d_head,
                          d_ff=d_model if config.ffn == "guide_product" else 20)


@pytest.mark.parametrize("name", list(PRESETS))
def test_each_preset_has_a_schema_whose_count_is_the_costs_formula(name: str) -> None:
    config = PRESETS[name]
    schema = {s.name: s.shape for s in parameter_schema(config)}
    assert parameter_count(config) == ref.param_count_total(config) \
        == sum(int(np.prod(shape)) for shape in schema.values())
    a, d = config.n_heads * config.d_head, config.d_model
    assert schema["blocks.0.attn.w_qkv"] == (d, 3 * a)
    assert schema["blocks.0.attn.w_o"] == (a, d)
    assert ("wpe" in schema) == config.positional_embedding
    assert ("blocks.0.attn.b_qkv" in schema) == ("blocks.0.attn.b_o" in schema) == config.attn_bias
    assert ("blocks.0.ffn.b_1" in schema) == ("blocks.0.ffn.b_2" in schema) == config.ffn_bias


def test_the_document_presets_are_literal() -> None:
    blueprint, guide = PRESETS["blueprint"], PRESETS["guide"]
    # Blueprint: eqs 2 and 4 have no bias, eq 6 has b_1 and b_2; learned p_i (sec. 2.1)
    assert (blueprint.attn_bias, blueprint.ffn_bias, blueprint.positional_embedding) \
        == (False, True, True)
    assert (blueprint.norm, blueprint.ffn, blueprint.tied_embeddings) == ("post", "relu", True)
    # Guide: z_i = E(x_i) alone (sec. 2); FFNN with b_1, b_2 (sec. 4); O = W H + b (sec. 6)
    assert (guide.positional_embedding, guide.attn_bias, guide.ffn_bias) == (False, False, True)
    assert (guide.tied_embeddings, guide.output_bias) == (False, True)
    assert PRESETS["guide-positional"] == guide.replace(positional_embedding=True)
    assert not PRESETS["notes"].head_width_is_derived  # the Notes' d_H is free


# GPT-3's Table 2.1 as printed: (n_layers, d_model, n_heads, d_head).
TABLE_2_1 = {
    "gpt3-small": (12, 768, 12, 64), "gpt3-medium": (24, 1024, 16, 64),
    "gpt3-large": (24, 1536, 16, 96), "gpt3-xl": (24, 2048, 24, 128),
    "gpt3-2.7b": (32, 2560, 32, 80), "gpt3-6.7b": (32, 4096, 32, 128),
    "gpt3-13b": (40, 5140, 40, 128), "gpt3-175b": (96, 12288, 96, 128),
}


@pytest.mark.parametrize("name", list(TABLE_2_1))
def test_gpt3_presets_are_table_2_1_and_their_counts_near_the_published_ones(name: str) -> None:
    config, published = GPT3_TABLE[name]
    assert PRESETS[name] == config
    assert (config.n_layers, config.d_model, config.n_heads, config.d_head) == TABLE_2_1[name]
    assert (config.n_ctx, config.vocab_size, config.d_ff) == (2048, 50257, 4 * config.d_model)
    ratio = parameter_count(config) / published
    if name == "gpt3-xl":  # 24 × 128 ≠ 2048: the row counts ~1.52B (PRESET_DECISIONS)
        assert 1.16 < ratio < 1.17
    else:  # the table's counts are rounded (125M, 350M, …): within 2%
        assert abs(ratio - 1) < 0.02, ratio


def test_preset_decisions_are_complete_decisions() -> None:
    for key in ("blueprint", "guide", "notes", "gpt3-table", "gpt3-attention"):
        decision = PRESET_DECISIONS[key]
        assert isinstance(decision, Decision)
        assert decision.readings and decision.decision and decision.why


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", list(PRESETS))
def test_each_preset_shrunk_runs_within_budget_in_fast(name: str, dtype: str) -> None:
    """The fast model on the parameters rounded to ``dtype`` against the float64 reference,
    within the conformance suite's derived budget for every logit; then the cached path
    (generation: a prompt, then one token at a time) within the same budget."""
    original, config = PRESETS[name], shrunk(PRESETS[name])
    switches = ("attn_bias", "ffn_bias", "positional_embedding", "norm", "ffn",
                "tied_embeddings", "output_bias", "final_norm", "head_width_is_derived")
    assert [getattr(config, s) for s in switches] == [getattr(original, s) for s in switches]
    params = {k: B.round_to(v, dtype) for k, v in random_parameters(config).items()}
    tokens = np.random.default_rng(1).integers(0, config.vocab_size, (2, config.n_ctx))
    want = ref.gpt_forward(tokens, params, config)
    bound = B.budget(B.gpt_forward_bound(tokens, params, config, B.Precision.of(dtype)))
    model = GPT.from_parameters(params, config, dtype=dtype)
    whole = B.compare(model(torch.as_tensor(tokens)).detach().double().numpy(), want, bound)
    assert whole.passed, whole.describe()
    cache = model.new_cache(2)
    steps = [model(torch.as_tensor(tokens[:, :5]), cache=cache)]
    steps += [model(torch.as_tensor(tokens[:, t:t + 1]), cache=cache) for t in range(5, config.n_ctx)]
    cached = B.compare(torch.cat(steps, dim=1).detach().double().numpy(), want, bound)
    assert cached.passed, cached.describe()


def test_the_budget_comparison_can_fail() -> None:
    """Without its positional embedding the Blueprint's model misses the budget: the check
    above sees whether W_P is added."""
    config = shrunk(PRESETS["blueprint"])
    params = random_parameters(config)
    tokens = np.random.default_rng(1).integers(0, config.vocab_size, (2, config.n_ctx))
    want = ref.gpt_forward(tokens, params, config)
    bound = B.budget(B.gpt_forward_bound(tokens, params, config, B.Precision.of("float64")))
    no_positions = config.replace(positional_embedding=False)
    model = GPT.from_parameters({k: v for k, v in params.items() if k != "wpe"}, no_positions,
                                dtype="float64")
    assert not B.compare(model(torch.as_tensor(tokens)).detach().numpy(), want, bound).passed


def random_parameters(config: GPTConfig, seed: int = 3) -> dict[str, np.ndarray]:
    """Every entry random (gains near one, biases nonzero), so that every parameter,
    each bias and W_P included, moves the logits."""
    rng = np.random.default_rng(seed)
    return {s.name: (1.0 + 0.1 * rng.normal(size=s.shape)) if s.init == "ones"
            else rng.normal(0.0, 0.3, s.shape) for s in parameter_schema(config)}
