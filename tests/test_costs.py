"""Size and cost formulas: sympy meaning ↔ reference ↔ the schema ↔ the fast backend."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import sympy as sp

from gptspec import reference
from gptspec.spec import PRESETS, REGISTRY, GPTConfig, parameter_schema
from gptspec.spec import costs as spec_costs

COST_IDS = [e.id for e in REGISTRY.by_group("costs")]

# Published element counts of the released GPT-2 checkpoints.
PUBLISHED = {"gpt2": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080,
             "gpt2-xl": 1_557_611_200}

# Variants that exercise every structural switch, beyond the presets.
VARIANTS = {
    **PRESETS,
    "no-bias": PRESETS["tiny"].replace(attn_bias=False, ffn_bias=False),
    "blueprint-biases": PRESETS["tiny"].replace(attn_bias=False),
    "no-ffn-bias": PRESETS["tiny"].replace(ffn_bias=False),
    "guide-no-positions": PRESETS["tiny-guide"].replace(positional_embedding=False),
    "free-head-width": PRESETS["tiny"].replace(d_model=30, n_heads=4, d_head=5),
    "untied": PRESETS["tiny"].replace(tied_embeddings=False),
    "untied-bias": PRESETS["tiny"].replace(tied_embeddings=False, output_bias=True),
    "odd": GPTConfig(vocab_size=37, n_ctx=11, d_model=12, n_layers=3, n_heads=3, d_ff=20,
                     norm="post", ffn="gelu", final_norm=True),
}


def schema_elements(config: GPTConfig, keep=lambda name: True) -> int:
    return sum(int(np.prod(p.shape)) for p in parameter_schema(config) if keep(p.name))


def test_every_cost_entry_has_its_reference_function():
    assert COST_IDS, "no costs entries declared"
    for entry_id in COST_IDS:
        assert REGISTRY[entry_id].reference == entry_id
        assert callable(getattr(reference, entry_id))
    assert set(COST_IDS) == set(reference.costs.__all__)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_gpt2_counts(name):
    config = PRESETS[name]
    assert reference.param_count_total(config) == PUBLISHED[name]
    assert spec_costs.param_count_total.sympy(config) == PUBLISHED[name]


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("entry_id", COST_IDS)
def test_sympy_meaning_equals_reference(name, entry_id):
    config = VARIANTS[name]
    fn = getattr(reference, entry_id)
    extra = {k: v for k, v in {"batch": 3, "bytes_per_element": 4,
                               "seq_len": config.n_ctx // 2 + 1}.items()
             if k in inspect.signature(fn).parameters}
    value = REGISTRY[entry_id].sympy(config, **extra)
    assert isinstance(value, sp.Integer), f"{entry_id} did not evaluate to an integer"
    assert int(value) == fn(config, **extra)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_counts_equal_the_schema_component_by_component(name):
    config = VARIANTS[name]
    L = config.n_layers
    assert reference.param_count_total(config) == schema_elements(config)
    assert reference.param_count_token_embedding(config) == schema_elements(
        config, lambda n: n == "wte")
    assert reference.param_count_positional_embedding(config) == schema_elements(
        config, lambda n: n == "wpe")
    assert L * reference.param_count_attention(config) == schema_elements(
        config, lambda n: ".attn." in n)
    assert L * reference.param_count_ffn(config) == schema_elements(
        config, lambda n: ".ffn." in n)
    assert L * reference.param_count_block_norms(config) == schema_elements(
        config, lambda n: n.startswith("blocks.") and ".ln_" in n)
    assert reference.param_count_final_norm(config) == schema_elements(
        config, lambda n: n.startswith("ln_f."))
    assert reference.param_count_unembedding(config) == schema_elements(
        config, lambda n: n in ("w_u", "b_u"))


def test_symbolic_gpt2_count_is_kaplans_12_L_d_squared_plus_lower_order_terms():
    V, n_ctx, d, L = spec_costs.V, spec_costs.n_ctx, spec_costs.d_model, spec_costs.L
    gpt2 = {spec_costs.d_ff: 4 * d, spec_costs.d_H: d / spec_costs.h}  # and h·d_H = d
    total = spec_costs.param_count_total.sympy().subs(gpt2)
    assert sp.expand(total - (V * d + n_ctx * d + L * (12 * d**2 + 13 * d) + 2 * d)) == 0


def test_symbolic_forward_flops_matches_kaplan_plus_the_unembedding():
    V, n_ctx, d, L = spec_costs.V, spec_costs.n_ctx, spec_costs.d_model, spec_costs.L
    gpt2 = {spec_costs.d_ff: 4 * d, spec_costs.d_H: d / spec_costs.h}
    forward = spec_costs.forward_flops_per_token.sympy().subs(gpt2)
    non_embedding = 12 * L * d**2  # Kaplan's N ≈ 2 d_model n_layer (2 d_attn + d_ff)
    kaplan = 2 * non_embedding + 2 * L * n_ctx * d
    assert sp.expand(forward - kaplan - 2 * d * V) == 0
    training = spec_costs.training_flops_per_token.sympy()
    assert sp.expand(training - 3 * spec_costs.forward_flops_per_token.sympy()) == 0


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_count_equals_the_fast_backends_parameters(name):
    pytest.importorskip("torch")
    from gptspec.fast.model import GPT

    config = PRESETS[name]
    model = GPT(config, device="meta")  # no memory: gpt2-xl would need 6 GB
    numel = sum(p.numel() for p in model.parameters())
    assert numel == reference.param_count_total(config)
    names = {n for n, _ in model.named_parameters()}
    assert names == {p.name for p in parameter_schema(config)}


@pytest.mark.parametrize("name", ["tiny", "tiny-post", "tiny-guide", "shakespeare-char"])
def test_forward_flops_agree_with_torchs_flop_counter(name):
    """torch counts every matmul of one forward over a full window. Its attention
    products are full T × T (masked entries are computed too): 4·L·T²·d, where our
    per-token causal convention counts half, 2·L·n_ctx·d per token."""
    torch = pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from gptspec.fast.model import GPT

    config = PRESETS[name]
    T = config.n_ctx
    model = GPT(config)
    tokens = torch.zeros((1, T), dtype=torch.long)
    counter = FlopCounterMode(display=False)
    # the math kernel runs attention as two batched matmuls the counter sees (the fused
    # CPU kernel has no FLOP formula and would count zero)
    with sdpa_kernel(SDPBackend.MATH), counter, torch.no_grad():
        model(tokens)
    measured = counter.get_total_flops()
    attention_full = 4 * config.n_layers * T * T * config.d_model
    attention_causal = 2 * config.n_layers * T * T * config.d_model
    expected = T * reference.forward_flops_per_token(config)
    assert measured - attention_full + attention_causal == expected


@pytest.mark.parametrize("name, dtype, nbytes", [("tiny", "float32", 4),
                                                 ("shakespeare-char", "bfloat16", 2)])
def test_kv_cache_bytes_equal_the_fast_backends_cache(name, dtype, nbytes):
    pytest.importorskip("torch")
    from gptspec.fast.kv_cache import KVCache

    config = PRESETS[name]
    cache = KVCache(config, batch_size=3, dtype=dtype)
    held = sum(t.numel() * t.element_size() for t in (cache.k, cache.v))
    assert held == reference.kv_cache_bytes(config, batch=3, bytes_per_element=nbytes)


def test_kv_cache_and_activation_memory_scale_as_stated():
    c = PRESETS["gpt2"]
    kv = reference.kv_cache_bytes
    assert kv(c, batch=3, bytes_per_element=4) == 6 * kv(c, batch=1, bytes_per_element=2)
    # K and V: 2 · 12 layers · 1024 positions · 768 wide · 2 bytes
    assert kv(c) == 2 * 12 * 1024 * 768 * 2
    act = reference.activation_memory_bytes
    assert act(c, batch=2, bytes_per_element=4) == 4 * act(c)
    # only the attention weights grow with T²: the second difference isolates L·h
    t = 64
    second_diff = act(c, seq_len=t + 1) - 2 * act(c, seq_len=t) + act(c, seq_len=t - 1)
    assert second_diff == 2 * 2 * c.n_layers * c.n_heads


def test_a_planted_mistake_in_a_component_is_caught():
    """The per-component schema comparison catches a formula that forgets the biases."""
    def attention_without_biases(config: GPTConfig) -> int:
        return 4 * config.d_model**2

    config = PRESETS["tiny"]
    assert attention_without_biases(config) * config.n_layers != schema_elements(
        config, lambda n: ".attn." in n)


def test_info_command_prints_the_published_count(capsys):
    from gptspec.cli import main

    assert main(["info", "gpt2-medium"]) == 0
    out = capsys.readouterr().out
    assert "354,823,168" in out
    assert f"{reference.forward_flops_per_token(PRESETS['gpt2-medium']):,}" in out
    assert main(["info", "no-such-preset"]) == 2
    assert "unknown preset" in capsys.readouterr().err


def test_info_reads_a_checkpoints_config(tmp_path, capsys):
    from gptspec.cli import main
    from gptspec.fast.checkpoint import save_model
    from gptspec.spec import init_parameters

    config = PRESETS["tiny-guide"]
    save_model(tmp_path, init_parameters(config), config)
    assert main(["info", str(tmp_path)]) == 0
    assert f"{reference.param_count_total(config):,}" in capsys.readouterr().out
