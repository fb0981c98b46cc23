"""Real sizes in the checks: the strategies reach every kernel boundary at the default
profile, still shrink to toy shapes, and the size-gated mutants are killed by the check
naming their entry while surviving it at toy sizes."""

from __future__ import annotations

from collections import Counter

import hypothesis
import numpy as np
import pytest
from hypothesis import Phase, given, settings

from gptspec.conformance import budgets, context
from gptspec.conformance import strategies as S
from gptspec.conformance.runner import run_suite
from meta.mutants import BY_NAME


def _draws(strategy, profile: str = "default", seed: int = 0) -> list:
    """What a property drawing ``strategy`` sees in one run of ``profile`` (as the suite
    runs it: the profile's settings, the run's seed)."""
    seen: list = []

    @given(value=strategy)
    def collect(value):
        seen.append(value)

    hypothesis.seed(seed)(context.suite_settings(profile)(collect))()
    return seen


def _block_class(n: int) -> int:
    return min(S.KERNEL_BLOCKS, key=lambda b: abs(b - n))


def test_lengths_reach_every_block_size_several_times_at_the_default_profile():
    seen = _draws(S.lengths(8))
    big = [n for n in seen if n > 8]
    assert set(big) <= set(S.BOUNDARY_LENGTHS)
    classes = Counter(_block_class(n) for n in big)
    assert set(classes) == set(S.KERNEL_BLOCKS), classes
    assert min(classes.values()) >= 1 and sum(classes.values()) >= 8, classes
    assert sum(n <= 8 for n in seen) > len(big), "big sizes must stay the minority"


def test_thorough_draws_every_boundary_length():
    assert set(S.BOUNDARY_LENGTHS) <= set(_draws(S.lengths(8), "thorough"))


def test_head_widths_and_vocabularies_reach_their_real_sizes():
    widths = _draws(S.head_widths(6))
    assert any(w > 64 for w in widths) and any(w == 64 for w in widths)
    vocabs = _draws(S.vocab_sizes(30), "thorough")
    assert {v for v in vocabs if v > 30} == set(S.VOCAB_SIZES)


def test_shapes_make_one_axis_big_at_a_time():
    seen = _draws(S.shapes((8, 24, 24), (S.BOUNDARY_LENGTHS,) * 3), "thorough")
    assert all(sum(x > 24 for x in shape) <= 1 for shape in seen)
    assert {i for shape in seen for i, x in enumerate(shape) if x > 24} == {0, 1, 2}


def test_without_a_big_share_every_size_is_small(monkeypatch):
    monkeypatch.setattr(S, "BIG_SHARE", 0.0)
    assert max(_draws(S.lengths(8))) <= 8
    assert max(_draws(S.vocab_sizes(30))) <= 30
    configs = _draws(S.configs(share=None))
    assert max(c.n_ctx for c in configs) <= 8 and max(c.vocab_size for c in configs) <= 24


def test_a_failure_at_a_big_size_shrinks_to_the_smallest_boundary_that_fails():
    found = hypothesis.find(S.lengths(8), lambda n: n > 64 and n % 64 != 0,
                            settings=settings(database=None, max_examples=500))
    assert found == 65


def test_big_model_cases_are_big_in_one_concern():
    for config in _draws(S.configs(share=1.0), "quick"):
        big = [config.n_ctx > 8, config.d_model // config.n_heads > 6,
               config.vocab_size > 24]
        assert sum(big) <= 2 and any(big), config  # head widths come with n_ctx ≤ 129
        if config.n_ctx > 129:
            assert config.d_model <= 18 and config.vocab_size <= 24


def test_token_ids_include_the_top_of_the_vocabulary_and_ids_past_2_16():
    ids = np.concatenate(_draws(S.token_ids(65537)))
    assert ids.max() == 65536 and 65535 in ids and ids.min() >= 0


@pytest.mark.parametrize("dtype, n, power, expected", [
    ("float16", 2, 1, 65504.0),  # softmax: every float16 value (float32 internals)
    ("bfloat16", 2, 1, float(np.finfo(np.float32).max) / 2),  # bfloat16 has float32's range
    ("float32", 2, 1, float(np.finfo(np.float32).max) / 2),
    ("float16", 4 * 1025, 2, 65504.0),  # LayerNorm's squares fit float32 easily
    ("float32", 4 * 1025, 2, (float(np.finfo(np.float32).max) / 4100) ** 0.5),
])
def test_edge_scale_is_the_contract_s_headroom(dtype, n, power, expected):
    assert S.edge_scale(dtype, n, power) == pytest.approx(expected, rel=1e-12)


def test_large_scale_for_float16_keeps_n_products_and_a_bias_finite():
    for n in (1, 16, 64, 1025):
        L = S.large_scale("float16", n)
        assert 2 * n * L * L == pytest.approx(budgets.LARGEST["float16"])
    assert S.large_scale("float32", 64) == 1e3


def test_edge_flavours_reach_the_edges():
    edge = S.ArrayRecipe((1000,), "overflow_edge", 65504.0, 0).make()
    assert np.abs(edge).max() <= 65504 and np.abs(edge).min() >= 32752
    tiny = S.ArrayRecipe((1000,), "underflow_edge", budgets.TINY["float16"], 0).make()
    assert np.abs(tiny).min() >= 2.0**-24 and np.abs(tiny).max() <= 2.0**-12
    assert (np.abs(budgets.round_to(tiny, "float16")) < budgets.TINY["float16"]).any()


# --- the size-gated mutants ------------------------------------------------------------------

SIZE_GATED = {
    "sdpa_drops_partial_key_tile": "scaled_dot_product_attention.differential",
    "sdpa_scale_capped_at_64": "scaled_dot_product_attention.differential",
    "online_softmax_max_not_rescaled": "softmax.differential",
    "token_ids_wrap_at_65536": "token_embedding.differential",
    "decode_step_drops_partial_key_tile": "generate.every_variant",
    "unembed_drops_partial_vocab_tile": "unembed_tied.differential",
}


@pytest.fixture
def no_shrinking(monkeypatch):
    """The suite's settings without the shrink phase: whether a check fails is decided by
    the examples it generates; shrinking big arrays only costs time here."""
    original = context.suite_settings

    def unshrunk(profile):
        return settings(original(profile), phases=[Phase.explicit, Phase.reuse, Phase.generate])

    monkeypatch.setattr(context, "suite_settings", unshrunk)
    import gptspec.conformance.runner as runner
    monkeypatch.setattr(runner, "suite_settings", unshrunk)


def _run_one(mutant: str, check_id: str):
    suite = run_suite(BY_NAME[mutant].backend(), profile="default", seed=0, area=None,
                      select=lambda c: c.id == check_id)
    [result] = suite.results
    return result


@pytest.mark.parametrize("mutant", sorted(SIZE_GATED))
def test_size_gated_mutant_is_killed_by_its_check_at_the_default_profile(mutant, no_shrinking):
    result = _run_one(mutant, SIZE_GATED[mutant])
    assert set(BY_NAME[mutant].breaks) & set(result.entries)
    assert result.status == "fail", result.detail


@pytest.mark.parametrize("mutant", sorted(SIZE_GATED))
def test_size_gated_mutant_survives_its_check_at_toy_sizes(mutant, no_shrinking, monkeypatch):
    monkeypatch.setattr(S, "BIG_SHARE", 0.0)
    result = _run_one(mutant, SIZE_GATED[mutant])
    assert result.status == "pass", result.detail


def test_the_honest_backend_passes_the_big_size_checks(no_shrinking):
    from gptspec.fast.backend import TorchBackend

    ids = set(SIZE_GATED.values())
    suite = run_suite(TorchBackend("cpu", "float32"), profile="default", seed=0, area=None,
                      select=lambda c: c.id in ids)
    assert {r.status for r in suite.results} == {"pass"}, [r.detail for r in suite.results]


def test_the_reference_of_a_case_is_computed_once_per_dtype():
    from gptspec.conformance.cases import reference_case
    from gptspec.spec.config import GPTConfig

    config = GPTConfig(vocab_size=65537, n_ctx=4, d_model=4, n_layers=1, n_heads=1, d_ff=8)
    recipe = S.ParameterRecipe(config, 0.3, 1)
    tokens = np.array([[65536, 0, 65535, 7]])
    first = reference_case(config, recipe, tokens, "float32")
    assert reference_case(config, recipe, tokens.copy(), "float32") is first
    assert reference_case(config, recipe, tokens, "float64") is not first
