"""Sampling and generation: spec ↔ reference, the reference loop, and gptspec.fast.generate.

The spec's sympy forms are evaluated exactly (rationals) or at 40 digits and compared
with the float64 reference; the fast generator is compared with the reference loop (the
spec's definition: the full forward recomputed every step) token for token.
"""

from __future__ import annotations

import itertools

import mpmath
import numpy as np
import pytest
import sympy as sp
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gptspec import reference as R
from gptspec.fast import ops
from gptspec.fast.generate import generate, stream
from gptspec.fast.model import GPT
from gptspec.fast.sampling import GREEDY, Sampling
from gptspec.fast.sampling import nucleus_filter as fast_nucleus
from gptspec.fast.sampling import sampling_distribution as fast_distribution
from gptspec.fast.sampling import top_k_filter as fast_top_k
from gptspec.spec import REGISTRY, init_parameters, preset

U64 = 2.0**-53  # float64 unit roundoff
SPEC = {e.id: e.sympy for e in REGISTRY.by_group("sampling")}
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def row(values) -> sp.Matrix:
    return sp.Matrix([list(values)])


def as_floats(m) -> np.ndarray:
    return np.array([float(v) for v in m], dtype=np.float64)


def kept(filtered) -> set[int]:
    """The token ids a filter kept (finite entries)."""
    return {i for i, v in enumerate(filtered) if v != -sp.oo and v != -np.inf}


small_ints = st.lists(st.integers(-3, 3), min_size=1, max_size=8)  # ties are likely


# --- temperature and greedy ------------------------------------------------------------------


@SETTINGS
@given(st.lists(st.floats(-8, 8), min_size=1, max_size=8),
       st.sampled_from([0.25, 0.7, 1.0, 3.0]))
def test_temperature_softmax_reference_matches_spec(z, tau):
    exact = SPEC["temperature_softmax"](
        row(sp.Float(v, 40) for v in z), sp.Float(tau, 40)).evalf(40)
    got = R.temperature_softmax(np.array(z), tau)
    # exp(z/τ) carries the rounding of z/τ (relative |z/τ| u); the sum adds V roundings
    budget = (2 * max(abs(v) for v in z) / tau + len(z) + 5) * U64
    for g, e in zip(got, exact, strict=True):
        assert abs(mpmath.mpf(g) - mpmath.mpf(sp.Float(e, 40)._mpf_)) <= budget * float(e)


def test_temperature_zero_and_negative_are_not_softmax():
    with pytest.raises(ValueError, match="greedy"):
        R.temperature_softmax(np.zeros(3), 0.0)
    with pytest.raises(ValueError, match="temperature"):
        R.sampling_distribution(np.zeros(3), -1.0)


@SETTINGS
@given(small_ints)
def test_greedy_takes_the_lowest_id_among_maxima(z):
    expected = min(i for i, v in enumerate(z) if v == max(z))  # the stated rule, directly
    assert int(SPEC["greedy_token"](row(z))) == expected
    assert R.greedy_token(np.array(z, dtype=float)) == expected
    q = R.sampling_distribution(np.array(z, dtype=float), temperature=0)
    assert q[expected] == 1 and q.sum() == 1


# --- top-k -----------------------------------------------------------------------------------


@SETTINGS
@given(small_ints, st.integers(1, 10))
def test_top_k_reference_matches_spec_and_the_tie_rule(z, k):
    spec_set = kept(SPEC["top_k_filter"](row(z), k))
    ref = R.top_k_filter(np.array(z, dtype=float), k)
    assert kept(ref) == spec_set
    # The rule, checked from its statement: everything kept is ≥ everything dropped, at
    # least min(k, V) are kept, and more only when they tie with the k-th value.
    kth = sorted(z, reverse=True)[min(k, len(z)) - 1]
    assert spec_set == {i for i, v in enumerate(z) if v >= kth}
    assert len(spec_set) >= min(k, len(z))
    if len(set(z)) == len(z):
        assert len(spec_set) == min(k, len(z))
    assert all(ref[i] == z[i] for i in spec_set)  # kept logits unchanged


def test_top_k_keeps_every_token_tied_with_the_kth_value():
    z = [2, 2, 2, 0]
    assert kept(SPEC["top_k_filter"](row(z), 2)) == {0, 1, 2}
    assert kept(R.top_k_filter(np.array(z, dtype=float), 2)) == {0, 1, 2}

    def exactly_k(z, k):  # a plausible but different rule: the first k after a sort
        return set(np.argsort(-np.asarray(z), kind="stable")[:k].tolist())

    assert exactly_k(z, 2) != kept(SPEC["top_k_filter"](row(z), 2))  # the test tells them apart


# --- nucleus ---------------------------------------------------------------------------------


def smallest_mass_set_size(probs, p) -> int:
    """By brute force over all subsets: the least size of a set of mass ≥ p."""
    n = len(probs)
    for size in range(1, n + 1):
        if any(sum(probs[i] for i in c) >= p for c in itertools.combinations(range(n), size)):
            return size
    raise AssertionError("no set reaches p")


rational_probs = st.lists(st.integers(1, 6), min_size=1, max_size=6).map(
    lambda w: [sp.Rational(x, sum(w)) for x in w])


@SETTINGS
@given(rational_probs, st.integers(1, 12).map(lambda n: sp.Rational(n, 12)))
def test_nucleus_is_the_smallest_set_reaching_p(probs, p):
    logits = row(sp.log(q) for q in probs)  # exp(log q) = q exactly: exact masses
    nucleus = kept(SPEC["nucleus_filter"](logits, p))
    assert sum(probs[i] for i in nucleus) >= p
    assert len(nucleus) == smallest_mass_set_size(probs, p)
    # it is a prefix of the stated order: descending probability, then ascending id
    order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))
    assert nucleus == set(order[: len(nucleus)])


@SETTINGS
@given(st.lists(st.floats(-4, 4), min_size=1, max_size=7), st.floats(0.05, 1.0))
def test_nucleus_reference_matches_spec(z, p):
    probs = R.softmax(np.array(z))
    order = sorted(range(len(z)), key=lambda i: (-probs[i], i))
    # Off the boundary: no cumulative mass within rounding of p, no near-ties.
    assume(all(abs(np.cumsum(probs[order])[m] - p) > 1e-9 for m in range(len(z))))
    assume(all(abs(a - b) > 1e-9 or a == b for a, b in itertools.combinations(probs, 2)))
    # ties decided on the exact logits: float64 probabilities can round two logits that
    # differ by 1e-41 to one tie, which the 40-digit spec still orders
    assume(all(abs(a - b) > 1e-9 or a == b for a, b in itertools.combinations(z, 2)))
    spec = kept(SPEC["nucleus_filter"](row(sp.Float(v, 40) for v in z), sp.Float(p, 40)))
    assert kept(R.nucleus_filter(np.array(z), p)) == spec


def test_nucleus_includes_the_crossing_token_and_breaks_ties_by_id():
    probs = [sp.Rational(1, 5), sp.Rational(1, 2), sp.Rational(3, 10)]
    logits = row(sp.log(q) for q in probs)
    assert kept(SPEC["nucleus_filter"](logits, sp.Rational(1, 2))) == {1}  # reaches p exactly
    assert kept(SPEC["nucleus_filter"](logits, sp.Rational(6, 10))) == {1, 2}  # 2 crosses p
    assert kept(SPEC["nucleus_filter"](logits, 1)) == {0, 1, 2}
    flat = row([0, 0, 0, 0])
    assert kept(SPEC["nucleus_filter"](flat, sp.Rational(1, 2))) == {0, 1}
    assert kept(R.nucleus_filter(np.zeros(4), 0.5)) == {0, 1}
    assert kept(R.nucleus_filter(np.log([0.2, 0.5, 0.3]), 0.6)) == {1, 2}
    # A rule without the crossing token keeps only {1} at p = 0.6: the test tells it apart.
    without_crossing = {i for i in (1, 2) if sum(probs[j] for j in (1, 2)[: (1, 2).index(i) + 1])
                        < sp.Rational(6, 10)}
    assert without_crossing != {1, 2}


def test_nucleus_rejects_p_outside_0_1():
    for p in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="top-p"):
            R.nucleus_filter(np.zeros(3), p)


# --- the composed distribution and the draw --------------------------------------------------


@SETTINGS
@given(st.lists(st.integers(-6, 6), min_size=2, max_size=7),
       st.sampled_from([sp.Rational(1, 2), sp.Integer(1), sp.Integer(2)]),
       st.one_of(st.none(), st.integers(1, 5)),
       st.one_of(st.none(), st.sampled_from([sp.Rational(1, 3), sp.Rational(4, 5)])))
def test_sampling_distribution_reference_matches_spec(z, tau, k, p):
    exact = SPEC["sampling_distribution"](row(z), tau, k, p)
    exact_f = as_floats(exact.evalf(30))
    mass = np.cumsum(np.sort(exact_f)[::-1])
    assume(p is None or np.all(np.abs(mass - float(p)) > 1e-9))  # off the nucleus boundary
    got = R.sampling_distribution(np.array(z, dtype=float), float(tau), k,
                                  None if p is None else float(p))
    assert set(np.flatnonzero(got)) == set(np.flatnonzero(exact_f))
    np.testing.assert_allclose(got, exact_f, rtol=(len(z) + 2 * 6 / float(tau) + 5) * U64,
                               atol=0)


def test_nucleus_is_taken_after_the_temperature():
    z = np.log([0.6, 0.3, 0.1])
    # at τ = 1 the top token alone has mass 0.6 ≥ 0.55; at τ = 2 mass moves to the others
    assert np.count_nonzero(R.sampling_distribution(z, 1.0, top_p=0.55)) == 1
    assert np.count_nonzero(R.sampling_distribution(z, 2.0, top_p=0.55)) == 2


class FixedDraws:
    """A stand-in generator whose uniforms are given."""

    def __init__(self, *u: float) -> None:
        self.u = list(u)

    def random(self) -> float:
        return self.u.pop(0)


def test_sample_token_is_the_inverse_cdf_and_never_draws_a_zero():
    q = [0.25, 0.0, 0.75]
    for u, token in [(0.0, 0), (0.2499, 0), (0.25, 2), (0.9999, 2)]:
        assert R.sample_token(np.array(q), FixedDraws(u)) == token
        exact = [sp.Rational(1, 4), 0, sp.Rational(3, 4)]
        assert int(SPEC["sample_token"](row(exact), sp.Rational(u))) == token


def test_seeded_draws_are_reproducible_and_in_the_support():
    z = np.random.default_rng(0).normal(size=20) * 3
    q = R.sampling_distribution(z, 0.8, top_k=5, top_p=0.9)
    draws = [R.sample_token(q, np.random.default_rng(s)) for s in range(200)]
    again = [R.sample_token(q, np.random.default_rng(s)) for s in range(200)]
    assert draws == again
    assert set(draws) <= set(np.flatnonzero(q))


# --- the KV-cache identity -------------------------------------------------------------------


def test_kv_cache_identity_symbolically():
    """Row t of masked attention over all T positions equals attention of q_t over the
    keys and values of positions 0…t, as expressions in the matrices' entries."""
    T, d = 3, 2
    Q, K, V = (sp.Matrix(T, d, lambda i, j, n=n: sp.Symbol(f"{n}{i}{j}", real=True))
               for n in "qkv")
    scores = Q * K.T / sp.sqrt(d) + sp.Matrix(T, T, lambda i, j: -sp.oo if j > i else 0)
    for t in range(T):
        e = scores.row(t).applyfunc(sp.exp)
        full_row = (e / sum(e)) * V  # Blueprint eq 3, row t
        cached = SPEC["kv_cache_attention"](Q.row(t), K[: t + 1, :], V[: t + 1, :])
        assert sp.simplify(full_row - cached) == sp.zeros(1, d)


def test_kv_cache_attention_reference_matches_full_attention():
    rng = np.random.default_rng(3)
    T, d = 6, 4
    Q, K, V = (rng.normal(size=(T, d)) for _ in range(3))
    full = R.scaled_dot_product_attention(Q, K, V, R.causal_mask(T))
    for t in range(T):
        cached = R.kv_cache_attention(Q[t : t + 1], K[: t + 1], V[: t + 1])
        # two summation orders of the same d + T terms
        np.testing.assert_allclose(cached[0], full[t], rtol=0,
                                   atol=4 * (d + T) * U64 * np.abs(V).max())


# --- cropping, stopping, the loop ------------------------------------------------------------


def test_crop_context_and_stop_condition():
    assert R.crop_context(range(10), 4) == [6, 7, 8, 9] == SPEC["crop_context"](range(10), 4)
    assert R.crop_context([1, 2], 4) == [1, 2]
    assert R.stop_condition(7, 1, 5, eot_token=7) and not R.stop_condition(7, 1, 5)
    assert R.stop_condition(3, 5, 5) and not R.stop_condition(3, 4, 5, eot_token=7)


def peaked(name: str, seed: int = 0) -> tuple:
    """A tiny model with large weights: peaked next-token distributions, so greedy choices
    have margins far above rounding."""
    config = preset(name)
    return config, init_parameters(config, seed=seed, std=0.5)


def test_reference_loop_equals_the_spec_loop():
    config, params = peaked("tiny")
    prompt = [3, 1, 4, 1, 5]
    n = config.n_ctx + 4  # runs past n_ctx: cropping is exercised

    def next_logits(context):
        return row(R.gpt_forward(np.array(context), params, config)[-1])

    spec = SPEC["generate"](prompt, next_logits, n, config.n_ctx)
    assert R.generate([prompt], params, config, n, temperature=0) == [spec]
    draws = np.random.default_rng(9).random(n)
    spec_sampled = SPEC["generate"](prompt, next_logits, n, config.n_ctx, 1, 4, None,
                                    [sp.Float(u, 30) for u in draws])
    ref_sampled = R.generate([prompt], params, config, n, temperature=1.0, top_k=4,
                             rng=FixedDraws(*draws))
    assert ref_sampled == [spec_sampled]


def test_reference_generate_crops_stops_and_reports_logits():
    config, params = peaked("tiny")
    long_prompt = list(np.random.default_rng(1).integers(0, config.vocab_size, 40))
    cropped = long_prompt[-config.n_ctx:]
    assert R.generate([long_prompt], params, config, 5, temperature=0) == \
        R.generate([cropped], params, config, 5, temperature=0)
    first = R.generate([cropped], params, config, 1, temperature=0)[0][0]
    assert R.generate([cropped], params, config, 10, temperature=0, eot_token=first) == [[first]]
    assert R.generate([cropped], params, config, 0, temperature=0) == [[]]
    [tokens], [logits] = R.generate([[1, 2]], params, config, 3, temperature=0,
                                    return_logits=True)
    # step k's logits are the last row of the forward pass over the prompt and the k
    # tokens before it (each prefix on its own: a BLAS may round a row of a longer
    # product differently, as OpenBLAS does on an AVX2 CPU)
    expected = [R.gpt_forward(np.array([1, 2, *tokens[:k]]), params, config)[-1]
                for k in range(3)]
    np.testing.assert_array_equal(logits, expected)
    assert tokens == [int(np.argmax(z)) for z in logits]


def test_reference_sampling_stays_in_the_top_k_and_is_seeded():
    config, params = peaked("tiny")
    [tokens], [logits] = R.generate([[1]], params, config, 12, temperature=1.5, top_k=3,
                                    rng=np.random.default_rng(4), return_logits=True)
    for t, z in zip(tokens, logits, strict=True):
        assert z[t] >= np.sort(z)[-3]
    assert [tokens] == R.generate([[1]], params, config, 12, temperature=1.5, top_k=3,
                                  rng=np.random.default_rng(4))
    with pytest.raises(ValueError, match="rng"):
        R.generate([[1]], params, config, 2, temperature=1.0)


# --- gptspec.fast.generate -------------------------------------------------------------------


def fast_model(params, config, dtype="float64") -> GPT:
    return GPT.from_parameters(params, config, dtype=dtype).requires_grad_(False)


PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7], [1, 8, 2, 8, 1]]


@pytest.mark.parametrize("name", ["tiny", "tiny-post", "tiny-guide"])
def test_fast_greedy_equals_the_reference_loop(name):
    config, params = peaked(name)
    n = config.n_ctx + 5  # past n_ctx: cropping and the cache refill are exercised
    model = fast_model(params, config)
    tokens, logits = generate(model, PROMPTS, n, GREEDY, return_logits=True)
    refs, refs_logits = R.generate(PROMPTS, params, config, n, temperature=0, return_logits=True)
    for got, got_logits, ref, ref_logits in zip(tokens, logits, refs, refs_logits, strict=True):
        assert got == ref
        # float64 both ways: the cache changes only the summation order
        scale = np.abs(ref_logits).max()
        np.testing.assert_allclose(got_logits.numpy(), ref_logits, rtol=0,
                                   atol=64 * (config.d_model + config.n_ctx) * U64 * scale)


def test_fast_cache_equals_no_cache_and_batch_equals_alone():
    config, params = peaked("tiny", seed=2)
    model = fast_model(params, config, "float32")
    n = config.n_ctx + 3
    cached, cached_logits = generate(model, PROMPTS, n, return_logits=True)
    fresh, fresh_logits = generate(model, PROMPTS, n, use_cache=False, return_logits=True)
    assert cached == fresh
    u32 = 2.0**-24
    for a, b in zip(cached_logits, fresh_logits, strict=True):
        budget = 16 * (config.d_model + config.d_ff) * u32 * float(b.abs().max())
        assert float((a - b).abs().max()) <= budget
    alone = [generate(model, [p], n)[0] for p in PROMPTS]
    assert alone == cached


def test_fast_stops_each_sequence_on_its_own():
    config, params = peaked("tiny")
    model = fast_model(params, config)
    free = generate(model, PROMPTS, 6)
    eot = free[1][2]  # sequence 1's third token: it stops there (others may too, earlier)
    stopped = generate(model, PROMPTS, 6, eot_token=eot)
    for seq, ref in zip(stopped, free, strict=True):
        end = ref.index(eot) + 1 if eot in ref else len(ref)
        assert seq == ref[:end]
    steps = list(stream(model, PROMPTS, 6, eot_token=eot))
    assert steps[-1].index == max(len(s) for s in stopped)
    for step in steps:
        for b, token in enumerate(step.tokens):
            assert (token is None) == (step.index > len(stopped[b]))


def test_fast_stream_yields_each_token_before_computing_the_next(monkeypatch):
    config, params = peaked("tiny")
    model = fast_model(params, config)
    calls = []
    # every forward computation (the model's, or the decoding step's) starts with it
    embed = ops.input_representation
    monkeypatch.setattr(ops, "input_representation",
                        lambda *args: calls.append(1) or embed(*args))
    steps = stream(model, PROMPTS[:1], 5)
    first = next(steps)
    assert first.index == 1 and len(calls) == 1  # the prompt, nothing more yet
    next(steps)
    assert len(calls) == 2
    seen = []
    generate(model, PROMPTS, 3, on_token=lambda b, t: seen.append((b, t)))
    assert [b for b, _ in seen] == [0, 1, 2] * 3


def test_fast_sampling_is_seeded_and_stays_in_the_filtered_set():
    config, params = peaked("tiny")
    model = fast_model(params, config, "float32")
    sampling = Sampling(temperature=1.3, top_k=4, top_p=0.9)
    a, logits = generate(model, PROMPTS, 12, sampling, seed=11, return_logits=True)
    assert generate(model, PROMPTS, 12, sampling, seed=11) == a
    for tokens, z in zip(a, logits, strict=True):
        for t, row_z in zip(tokens, z, strict=True):
            q = R.sampling_distribution(row_z.double().numpy(), 1.3, 4, 0.9)
            assert q[t] > 0


@SETTINGS
@given(st.lists(st.integers(-5, 5), min_size=2, max_size=12),
       st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.one_of(st.none(), st.integers(1, 6)),
       st.one_of(st.none(), st.sampled_from([0.3, 0.75, 0.95, 1.0])))
def test_fast_distribution_has_the_reference_support(z, tau, k, p):
    """The distribution fast samples from: same support as the reference's (checked on
    the distribution, so a draw outside the set is impossible, not merely unlikely)."""
    ref = R.sampling_distribution(np.array(z, dtype=float), tau, k, p)
    probs = R.softmax(np.array(z, dtype=float) / (tau or 1))
    assume(p is None or np.all(np.abs(np.cumsum(np.sort(probs)[::-1]) - p) > 1e-6))
    got = fast_distribution(torch.tensor(z, dtype=torch.float32), tau, k, p).double().numpy()
    assert set(np.flatnonzero(got)) == set(np.flatnonzero(ref))
    np.testing.assert_allclose(got, ref, rtol=0, atol=(len(z) + 8 * 5 / (tau or 1)) * 2.0**-24)


def test_fast_filters_follow_the_tie_rules():
    z = torch.tensor([[2.0, 2.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.isfinite(fast_top_k(z, 2)).tolist() == [[True, True, True, False]] * 1 + \
        [[True, True, True, True]]
    assert torch.isfinite(fast_nucleus(z, 0.5)).tolist() == [[True, True, False, False],
                                                            [True, True, False, False]]


def test_fast_generate_rejects_bad_input():
    config, params = peaked("tiny")
    model = fast_model(params, config)
    for prompts, match in [([[]], "empty"), ([[config.vocab_size]], "outside"), ([], "non-empty")]:
        with pytest.raises(ValueError, match=match):
            generate(model, prompts, 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, [[1]], -1)
    for kwargs, match in [(dict(temperature=-1.0), "temperature"), (dict(top_k=0), "top-k"),
                          (dict(top_p=0.0), "top-p"), (dict(top_p=1.5), "top-p")]:
        with pytest.raises(ValueError, match=match):
            Sampling(**kwargs)
    assert generate(model, [[1]], 0) == [[]]


# --- the generation checks catch planted bugs -----------------------------------------------

from gptspec.conformance.runner import run_suite  # noqa: E402
from gptspec.fast.backend import TorchBackend  # noqa: E402
from gptspec.reference.backend import ReferenceBackend  # noqa: E402


def run_checks(backend, *ids):
    suite = run_suite(backend, profile="quick", seed=0, area="generation",
                      select=lambda c: c.id in ids)
    return {r.id: r.status for r in suite.results}


class NucleusWithoutCrossingToken(TorchBackend):
    def sampling_distribution(self, z, temperature=1.0, top_k=None, top_p=None):
        q = R.sampling_distribution(z, temperature, top_k, None)
        if top_p is None or temperature == 0:
            return q
        order = np.argsort(-q, kind="stable")
        keep = np.cumsum(q[order]) < top_p  # stops before the token that crosses p
        out = np.zeros_like(q)
        out[order[keep]] = q[order[keep]]
        return out / out.sum() if out.sum() else q


class TopKExactlyK(TorchBackend):
    def sampling_distribution(self, z, temperature=1.0, top_k=None, top_p=None):
        if top_k is None or temperature == 0:
            return R.sampling_distribution(z, temperature, None, top_p)
        z = np.asarray(z, dtype=np.float64)
        dropped = np.argsort(-z, kind="stable")[top_k:]  # ties broken by id, not kept
        z = z.copy()
        z[dropped] = -np.inf
        return R.sampling_distribution(z, temperature, None, top_p)


def _literal_loop(prompts, params, config, max_new_tokens, crop, next_logits=None, **options):
    """The reference loop with a replaceable crop (for planted bugs)."""
    out, out_logits = [], []
    for prompt in prompts:
        seq, new, logits = list(prompt), [], []
        for n in range(1, max_new_tokens + 1):
            z = R.gpt_forward(np.array(crop(seq, config.n_ctx)), params, config)[-1]
            token = int(np.argmax(z))
            seq.append(token)
            new.append(token)
            logits.append(z)
            if R.stop_condition(token, n, max_new_tokens, options.get("eot_token")):
                break
        out.append(new)
        out_logits.append(np.array(logits).reshape(len(new), config.vocab_size))
    return (out, out_logits) if options.get("return_logits") else out


class CropsTheWrongEnd(ReferenceBackend):
    def generate(self, prompts, params, config, max_new_tokens, **options):
        return _literal_loop(prompts, params, config, max_new_tokens,
                             lambda seq, n_ctx: seq[:n_ctx], **options)


class LeftPaddedBatch(TorchBackend):
    """Pads a batch on the left with token 0 and lets the padding into the context."""

    def generate(self, prompts, params, config, max_new_tokens, **options):
        width = max(len(p) for p in prompts)
        padded = [[0] * (width - len(p)) + list(p) for p in prompts]
        return _literal_loop(padded, params, config, max_new_tokens,
                             lambda seq, n_ctx: seq[-n_ctx:], **options)


class GeneratorKeptAcrossCalls(TorchBackend):
    """Seeds its sampler once, at construction, and ignores the caller's rng."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rng = np.random.default_rng(0)

    def generate(self, prompts, params, config, max_new_tokens, **options):
        options["rng"] = self.rng
        return super().generate(prompts, params, config, max_new_tokens, **options)


class SamplesFromTheUnfilteredSoftmax(TorchBackend):
    def generate(self, prompts, params, config, max_new_tokens, **options):
        options.pop("top_k", None)
        options.pop("top_p", None)
        return super().generate(prompts, params, config, max_new_tokens, **options)


@pytest.mark.parametrize("backend, check_id", [
    (NucleusWithoutCrossingToken(dtype="float64"), "sampling_distribution.differential"),
    (TopKExactlyK(dtype="float64"), "sampling_distribution.differential"),
    (CropsTheWrongEnd(), "generate.greedy_reference"),
    (LeftPaddedBatch(dtype="float64"), "generate.batch_invariance"),
    (GeneratorKeptAcrossCalls(dtype="float64"), "generate.seeded"),
    (SamplesFromTheUnfilteredSoftmax(dtype="float64"), "sample_token.support"),
], ids=lambda x: type(x).__name__ if not isinstance(x, str) else x)
def test_generation_checks_catch_planted_bugs(backend, check_id):
    assert run_checks(backend, check_id)[check_id] == "fail"


@pytest.mark.parametrize("backend", [ReferenceBackend(), TorchBackend(dtype="float32")],
                         ids=["reference", "torch-float32"])
def test_generation_checks_pass_honest_backends(backend):
    from gptspec.conformance.registry import all_checks

    ids = [c.id for c in all_checks("generation")]
    assert len(ids) >= 6
    statuses = run_checks(backend, *ids)
    # its own generate and sampling_distribution are judged, not the judge's loop over its logits
    through_forward = {i for i in ids if i.endswith(".through_forward")}
    assert {statuses[i] for i in through_forward} == {"not-applicable"}
    assert {s for i, s in statuses.items() if i not in through_forward} == {"pass"}


def test_fast_greedy_equals_transformers_generate_on_the_same_weights():
    """The benchmark's peer computes the same tokens (float64, peaked weights): the
    speeds it reports compare like with like."""
    from benchmarks.generation import hf_generate, hf_model, weight_bytes_per_step

    config = preset("tiny").replace(n_ctx=32)
    params = init_parameters(config, seed=5, std=0.5)
    model = fast_model(params, config)
    hf = hf_model(config, model)
    prompts = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    ours = generate(model, prompts.tolist(), 12, GREEDY)
    assert hf_generate(hf, prompts, 12).tolist() == ours
    n_weights = sum(int(np.prod(v.shape)) for v in params.values())
    assert weight_bytes_per_step(model) == 8 * (n_weights - (config.n_ctx - 1) * config.d_model)


def test_generation_through_the_step_graph_gives_the_eager_steps(monkeypatch):
    """generate's CUDA-graph step (``_GraphedStep``: the step planned on the device and
    replayed), with the capture made eager so that it runs on the CPU: the tokens and
    logits of the eager path, through a sequence that stops early, a refill past n_ctx
    and sampling. On a GPU the capture itself is what benchmarks/gpu.py checks."""
    from gptspec.fast import generate as G

    model = GPT(preset("tiny"), seed=5, dtype="float64").eval()
    prompts = [[1, 2, 3], [4, 5, 6]]
    sampling = Sampling(temperature=0.9, top_k=20)
    first = generate(model, prompts, 30, sampling, seed=3)
    # sequence 0 stops early, sequence 1 goes on
    eot = next(t for t in first[0][2:] if t not in first[1])
    want = generate(model, prompts, 30, sampling, seed=3, eot_token=eot, return_logits=True)
    assert len(want[0][0]) < 30 and len(want[0][1]) == 30  # early stop; past n_ctx = 16

    replays = []

    def eager_capture(step):
        out = step()
        return (lambda: replays.append(out.copy_(step()))), out

    monkeypatch.setattr(G, "_capture", eager_capture)
    monkeypatch.setattr(G, "_graphable", lambda device: True)
    got = generate(model, prompts, 30, sampling, seed=3, eot_token=eot, return_logits=True)
    assert replays  # the graph's path ran
    assert got[0] == want[0]
    for a, b in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(G, "_graphable", lambda device: False)
    replays.clear()
    assert generate(model, prompts, 30, sampling, seed=3, eot_token=eot) == want[0]
    assert not replays  # only on a device that has graphs
