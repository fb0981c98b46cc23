"""Meta-tests of the suite's helpers: rounding, comparison, budgets, strategies."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gptspec import reference as ref
from gptspec.conformance import budgets as B
from gptspec.conformance.strategies import FLAVOURS, ArrayRecipe, configs, model_cases
from gptspec.spec import check_parameters


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_round_to_matches_torch_rounding(dtype):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 1, 2000), rng.normal(0, 1e3, 2000),
                        [0.0, -0.0, 1.0, 1.00390625, 1.01171875, 65504.0, np.inf, -np.inf]])
    if dtype == "float16":
        x = x[np.abs(x) < 6e4]
    ours = B.round_to(x, dtype)
    theirs = torch.tensor(x).to(getattr(torch, dtype)).double().numpy()
    np.testing.assert_array_equal(ours, theirs)


def test_unit_roundoffs_are_half_an_ulp_of_one():
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        eps = torch.finfo(getattr(torch, dtype)).eps
        assert B.Precision.of(dtype).u == eps / 2


def test_sixteen_bit_sums_are_accumulated_in_float32():
    assert B.Precision.of("bfloat16").u_acc == 2.0**-24
    assert B.Precision.of("float64").u_acc == 2.0**-53


def test_compare_reports_the_fraction_of_budget_at_the_worst_element():
    c = B.compare([1.0, 2.5, 3.0], [1.0, 2.0, 3.0], [1.0, 1.0, 1.0])
    assert c.passed and c.fraction == 0.5 and c.worst_index == (1,)
    assert not B.compare([1.0, 4.0], [1.0, 2.0], 1.0).passed


def test_compare_refuses_nan_wrong_shape_and_wrong_infinity():
    assert "NaN" in B.compare([np.nan], [1.0], 1.0).problem
    assert "shape" in B.compare(np.zeros(3), np.zeros((3, 1)), 1.0).problem
    assert not B.compare([np.inf], [-np.inf], 1.0).passed
    assert B.compare([-np.inf, 1.0], [-np.inf, 1.0], 0.0).passed
    assert not B.exact([1.0 + 1e-16 * 4], [1.0]).passed


@pytest.mark.parametrize(("result", "said"), [
    (np.array([1.0 + 0j, 2.0 + 0j]), "complex numbers"),  # NumPy dropped the imaginary part
    (np.array(["1.0", "2.0"]), "text"),  # and read these as numbers: both passed
    (["1.0", "2.0"], "text"), (np.array([b"1", b"2"]), "bytes"),
    (torch.tensor([1.0 + 0j, 2.0 + 0j]), "complex numbers"),
    (np.zeros(2, dtype=[("a", "f8")]), "records")])
def test_compare_refuses_results_that_are_not_real_numbers(result, said):
    outcome = B.compare(result, [1.0, 2.0], 1e-6)
    assert not outcome.passed and said in outcome.describe()


def test_compare_takes_real_numbers_in_any_container():
    for result in ([1.0, 2.0], np.array([1, 2]), np.array([1.0, 2.0], np.float32),
                   torch.tensor([1.0, 2.0]), (1.0, 2.0)):
        assert B.compare(result, [1.0, 2.0], 0.0).passed
    assert B.exact(np.array([[True, False]]), np.array([[1.0, 0.0]])).passed  # a one-hot
    ml_dtypes = pytest.importorskip("ml_dtypes")  # JAX's bfloat16: NumPy dtype kind V
    assert B.compare(np.array([1.0, 2.0], ml_dtypes.bfloat16), [1.0, 2.0], 0.0).passed


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_model_budget_covers_an_honest_low_precision_computation(dtype):
    """The derived budget must cover a plain same-dtype computation of the model (here
    the reference's own formulas evaluated in torch at that dtype), yet stay far below
    the size of the logits so that real bugs are seen."""
    from gptspec.conformance.strategies import ParameterRecipe
    from gptspec.spec import preset

    config = preset("tiny")
    params = {k: B.round_to(v, dtype)
              for k, v in ParameterRecipe(config, 0.3, 1).make().items()}
    tokens = np.random.default_rng(2).integers(0, config.vocab_size, (2, config.n_ctx))
    exact = ref.gpt_forward(tokens, params, config)
    budget = B.budget(B.gpt_forward_bound(tokens, params, config, B.Precision.of(dtype)))
    naive = _torch_forward(tokens, params, config, getattr(torch, dtype))
    c = B.compare(naive, exact, budget)
    assert c.passed, c.describe()
    if dtype == "float32":
        assert np.median(budget / np.abs(exact)) < 1e-3


def _torch_forward(tokens, params, config, dtype):
    """A plain pre-LN forward in ``dtype`` (matmuls accumulate in float32 on the CPU)."""
    t = {k: torch.tensor(v, dtype=dtype) for k, v in params.items()}
    x = torch.as_tensor(tokens)
    T = x.shape[1]
    H = t["wte"][x] + t["wpe"][:T]
    h, d = config.n_heads, config.d_model
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for layer in range(config.n_layers):
        p = {k[len(f"blocks.{layer}."):]: v for k, v in t.items()
             if k.startswith(f"blocks.{layer}.")}
        a = torch.nn.functional.layer_norm(H, (d,), p["ln_1.weight"], p["ln_1.bias"], 1e-5)
        q, k, v = (a @ p["attn.w_qkv"] + p["attn.b_qkv"]).split(d, dim=-1)
        q, k, v = (z.view(*z.shape[:2], h, d // h).transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(d // h)
        o = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v
        H = H + o.transpose(1, 2).reshape(H.shape) @ p["attn.w_o"] + p["attn.b_o"]
        a = torch.nn.functional.layer_norm(H, (d,), p["ln_2.weight"], p["ln_2.bias"], 1e-5)
        f = torch.nn.functional.gelu(a @ p["ffn.w_1"] + p["ffn.b_1"], approximate="tanh")
        H = H + f @ p["ffn.w_2"] + p["ffn.b_2"]
    H = torch.nn.functional.layer_norm(H, (d,), t["ln_f.weight"], t["ln_f.bias"], 1e-5)
    return (H @ t["wte"].T).double().numpy()


@given(recipe=st.builds(ArrayRecipe, shape=st.just((3, 5)), flavour=st.sampled_from(FLAVOURS),
                        scale=st.sampled_from((0.1, 1.0, 1e3)), seed=st.integers(0, 2**32 - 1)))
@settings(max_examples=20, deadline=None)
def test_array_recipes_rebuild_exactly(recipe):
    a, b = recipe.make(), recipe.make()
    assert a.shape == (3, 5) and np.array_equal(a, b) and np.all(np.isfinite(a))


@given(case=model_cases())
@settings(max_examples=20, deadline=None)
def test_model_cases_are_valid_models(case):
    config, recipe, tokens = case
    check_parameters(recipe.make(), config)
    assert tokens.shape[1] <= config.n_ctx and tokens.max() < config.vocab_size


@given(config=configs())
@settings(max_examples=30, deadline=None)
def test_generated_configurations_cover_the_variants_validly(config):
    assert config.d_attn == config.n_heads * config.d_head  # a free d_H need not divide
    assert not config.head_width_is_derived or config.d_model % config.n_heads == 0
    assert config.ffn != "guide_product" or config.d_ff == config.d_model


def test_generated_configurations_draw_each_documents_switches():
    """The suite covers the Blueprint's biases, the Guide's missing W_P and the Notes' free
    head width: each switch is drawn both ways."""
    seen = set()

    @given(config=configs())
    @settings(max_examples=200, deadline=None, database=None)
    def draw(config):
        seen.update({("attn_bias", config.attn_bias), ("ffn_bias", config.ffn_bias),
                     ("positions", config.positional_embedding),
                     ("free_head", not config.head_width_is_derived)})

    draw()
    assert seen == {(k, v) for k in ("attn_bias", "ffn_bias", "positions", "free_head")
                    for v in (True, False)}


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("dk", [1, 2, 64, 128])
def test_scores_at_the_edge_are_drawn_for_float16_alone(dtype, dk):
    """The attention_scores decision asks for scores whose Q Kᵀ lies past the dtype's range
    only where the accumulation format holds it with room for the softmax (float16 in
    float32). bfloat16 shares float32's range: at d_k = 1 its edge scores fitted float32
    only just, and FlashAttention's S·log₂e overflowed there (NaN on an H200)."""
    from types import SimpleNamespace

    from gptspec.conformance.checks_attention import _scores_at_the_edge

    ctx = SimpleNamespace(precision=SimpleNamespace(dtype=dtype))
    assert _scores_at_the_edge(None, ctx, 4, dk) is None
    # float16: drawn at every width, its scores representable and Q Kᵀ past 65504 (d_k ≥ 25)
    assert B.LARGEST["float16"] * max(math.sqrt(dk), 2.0) < B.LARGEST["float32"]


def test_what_a_backend_returns_is_read_as_plain_data():
    """plain_output: the built-in types rebuilt exactly (a subclass's __eq__ decides no
    comparison), arrays as plain views (a broadcast view is not copied), anything else
    behind a guard whose items are read as data too, and what it raises from a test
    framework the backend's error."""
    import hypothesis

    from gptspec.conformance.context import BackendSteered, Guarded, plain_output

    class Equal(list):
        def __eq__(self, other):
            return True

    class Yes(int):
        def __eq__(self, other):
            return True

    out = plain_output({"ids": Equal([1, 2]), "n": Yes(3), "x": (np.ones(2).view(np.matrix),)},
                       "op")
    assert type(out["ids"]) is list and out["ids"] != [9, 9]
    assert type(out["n"]) is int and out["n"] != 4
    assert type(out["x"][0]) is np.ndarray
    huge = plain_output(np.broadcast_to(np.ones(1), (1 << 40,)), "op")
    assert huge.shape == (1 << 40,) and huge.strides == (0,)

    def tokens():
        yield Equal([5])
        hypothesis.reject()

    guarded = plain_output(tokens(), "generate")
    assert isinstance(guarded, Guarded)
    items = iter(guarded)
    assert type(next(items)) is list
    with pytest.raises(BackendSteered, match="cannot reject, skip or stop"):
        next(items)
