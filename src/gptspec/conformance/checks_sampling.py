"""Checks of the sampling group (spec/sampling.py, reference/sampling.py): generation,
the sampling distribution, greedy decoding, the KV cache, batching, seeds.

The backend's ``sampling_distribution`` and ``generate`` are named and called like their
reference functions. Greedy tokens are compared exactly, with one allowance: where the
reference's two best logits lie within the logits' budget of each other, a backend may
pick the other (its logits are only known to that budget), and the sequences are not
compared from there on; a divergence anywhere else fails. A share of the greedy examples
(:data:`GENERATION_SHARE`) runs a model big in one concern: a context around a kernel
block with prompts generated across it, heads 64–128 wide, or a large vocabulary.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from gptspec import reference as ref
from gptspec.conformance import budgets as B
from gptspec.conformance.budgets import Precision
from gptspec.conformance.expressible import fit_to_backend
from gptspec.conformance.protocol import NotApplicable
from gptspec.conformance.registry import check
from gptspec.conformance.strategies import (
    DRAWN_IDS,
    KERNEL_BLOCKS,
    ParameterRecipe,
    arrays,
    configs,
    parameter_recipes,
    ragged_prompts,
)
from gptspec.spec.config import FFNS, NORMS

AREA = "generation"
MODEL = "the model's logits budget (budgets.gpt_forward_bound) at each step's context"
DEPENDS = ("gpt_forward.differential",)


# --- cases -------------------------------------------------------------------------------------

# The share of examples whose model is big in one concern (a context around a kernel block,
# heads of a real width, a real vocabulary; strategies.configs), as for the model checks.
# A big context is exercised where caches and tiles change behaviour: each prompt ends just
# below a block boundary and generation runs across it (or the prompt is longer than n_ctx).
GENERATION_SHARE = 1 / 4


@st.composite
def prompt_tokens(draw, V: int, length: int, label: str) -> list[int]:
    """``length`` ids below V: drawn one by one up to DRAWN_IDS (so that they shrink),
    made from a drawn seed beyond (a long prompt)."""
    if length <= DRAWN_IDS:
        return draw(st.lists(st.integers(0, V - 1), min_size=length, max_size=length),
                    label=label)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label=f"{label} seed"))
    return [int(t) for t in rng.integers(0, V, length)]


@st.composite
def crossing(draw, n_ctx: int) -> tuple[int, int]:
    """A prompt length L and a number of new tokens N for a context of n_ctx > 8: the
    context grows from just below a block boundary b < n_ctx (L = b − k, k of 1–2) to
    b + 1 (N = k + 2), within the cache; without such a b, across n_ctx (cropping). Or,
    a quarter of the time, the prompt is one longer than n_ctx: the first step crops."""
    if draw(st.integers(0, 3), label="prompt past n_ctx") == 3:  # shrinks to crossing
        return n_ctx + 1, draw(st.integers(1, 3), label="max_new_tokens")
    reached = [b for b in KERNEL_BLOCKS if b < n_ctx] or [n_ctx]
    b = draw(st.sampled_from(reached), label="boundary crossed")
    k = draw(st.integers(1, 2), label="tokens below the boundary")
    return b - k, k + 2


@st.composite
def generation_cases(draw, dtype: str, share: float | None = 0.0):
    """A small model, its parameters (rounded to the dtype), 1–3 prompts (some longer
    than n_ctx), a number of new tokens that runs past n_ctx, and maybe an end-of-text id.
    With probability ``share`` (None: strategies.BIG_SHARE) the model is big in one
    concern; with a context past 8, 1–2 prompts cross a block boundary (``crossing``)."""
    config = draw(configs(max_layers=2, max_ctx=6, max_vocab=16, share=share))
    recipe = draw(parameter_recipes(config, dtype))
    params = {k: B.round_to(v, dtype) for k, v in recipe.make().items()}
    if config.n_ctx > 8:
        plans = [draw(crossing(config.n_ctx), label=f"prompt {b} plan")
                 for b in range(draw(st.integers(1, 2), label="prompts"))]
        prompts = [draw(prompt_tokens(config.vocab_size, length, f"prompt {b}"))
                   for b, (length, _) in enumerate(plans)]
        max_new = max(n for _, n in plans)
    else:
        n_prompts = draw(st.integers(1, 3), label="prompts")
        prompts = [draw(st.lists(st.integers(0, config.vocab_size - 1), min_size=1,
                                 max_size=config.n_ctx + 2), label=f"prompt {b}")
                   for b in range(n_prompts)]
        max_new = draw(st.integers(1, config.n_ctx + 3), label="max_new_tokens")
    eot = draw(st.one_of(st.none(), st.integers(0, config.vocab_size - 1)), label="eot")
    return config, params, prompts, max_new, eot


def _fitted(backend, case: tuple) -> tuple:
    """``case`` (config, params, …) with its model in a configuration the backend can
    express (expressible.fit_to_backend), or NotApplicable: a narrow engine (GPT-2's
    structure only) is judged on the examples it can hold instead of declining them."""
    config, params, *rest = case
    return (*fit_to_backend(config, params, backend), *rest)


def _step_budgets(contexts: list[list[int]], params, config, p: Precision) -> list[np.ndarray]:
    """The budget of the last row of logits of each context (V,), no smaller than
    budgets.gpt_forward_bound gives it for that context alone: row t of the bound depends
    on the tokens up to t only, and the rows read count their own keys in the last block
    (all of their context's, as its own bound does), the earlier blocks the longer
    context's (no fewer). So every context that is a prefix of a longer one reads its
    row from the longer one's bound. The contexts of one generation
    extend each other until it crops them: one bound per run of them (over the last of
    each run), where one bound per step cost a whole forward bound for each new token of
    a long context; and of it only the rows read past the blocks that give the others
    their keys (budgets.hidden_bound's rows)."""
    out: list[np.ndarray] = [np.empty(0)] * len(contexts)
    last = len(contexts) - 1
    while last >= 0:
        longest = contexts[last]
        run = [last]
        while run[-1] > 0 and contexts[run[-1] - 1] == longest[:len(contexts[run[-1] - 1])]:
            run.append(run[-1] - 1)
        rows = [len(contexts[i]) - 1 for i in run]
        H, eH = B.hidden_bound(np.asarray([longest]), params, config, p, rows)
        budgets = B.budget(B.output_bound(H, eH, params, config, p))[0]
        for i, budget in zip(run, budgets, strict=True):
            out[i] = budget
        last = run[-1] - 1
    return out


def _near_tie(z: np.ndarray, a: int, b: int, bound: np.ndarray) -> bool:
    """Tokens a and b are both a plausible arg-max of logits known to within ``bound``."""
    return abs(float(z[a]) - float(z[b])) <= float(bound[a] + bound[b])


def _compare_greedy(ctx, what: str, prompt: list[int], got: list[int], got_logits,
                    want: list[int], want_logits, params, config, factor: float) -> None:
    """Token for token, logits within ``factor`` × budget, up to a legitimate divergence."""
    steps = list(zip(got, want, strict=False))
    # the steps compared: up to the first that differs (their contexts are the reference's)
    n_compared = next((n + 1 for n, (g, w) in enumerate(steps) if g != w), len(steps))
    seq, contexts = list(prompt), []
    for g, _ in steps[:n_compared]:
        contexts.append(ref.crop_context(seq, config.n_ctx))
        seq.append(g)
    budgets = _step_budgets(contexts, params, config, ctx.precision)
    for n, (g, w) in enumerate(steps[:n_compared]):
        bound = factor * budgets[n]
        if got_logits is not None:
            ctx.record(f"{what}: logits of step {n + 1}",
                       B.compare(got_logits[n], want_logits[n], bound))
        if g != w:
            z = np.asarray(want_logits[n], dtype=np.float64)
            ctx.require(_near_tie(z, g, w, bound),
                        f"{what}: step {n + 1} chose token {g}, expected {w} (logits "
                        f"{z[g]:.9g} vs {z[w]:.9g}, beyond the budget {bound[g] + bound[w]:.3g}"
                        f" of a near tie)")
            return  # the sequences differ from here on: nothing more to compare
    ctx.require(len(got) == len(want),
                f"{what}: {len(got)} tokens, expected {len(want)} (the stop conditions: "
                f"end-of-text or the length)")


def _generate(ctx, prompts, params, config, max_new, **options):
    out = ctx.op("generate")([list(p) for p in prompts], params, config, max_new, **options)
    tokens, logits = out if options.get("return_logits") else (out, None)
    ctx.require(len(tokens) == len(prompts),
                f"generate returned {len(tokens)} sequences for {len(prompts)} prompts")
    return [[int(t) for t in seq] for seq in tokens], logits


# --- greedy decoding, the KV cache, batches ----------------------------------------------------


def _greedy_matches_reference(ctx, case, label, through_forward: bool = False) -> None:
    """Greedy generation of ``case`` by the backend and by the reference, compared
    sequence by sequence (``_compare_greedy``); ``label(b, prompts)`` names sequence b.
    ``through_forward``: the backend's tokens are the reference's loop driven by its
    ``forward`` (an engine that returns logits and nothing else)."""
    config, params, prompts, max_new, eot = _fitted(ctx.backend, case)
    if through_forward:
        got, got_logits = ref.generate(prompts, params, config, max_new, temperature=0.0,
                                       eot_token=eot, return_logits=True,
                                       forward=_last_rows_of(ctx))
    else:
        got, got_logits = _generate(ctx, prompts, params, config, max_new, temperature=0.0,
                                    eot_token=eot, return_logits=True)
    want, want_logits = ref.generate(prompts, params, config, max_new, temperature=0.0,
                                     eot_token=eot, return_logits=True)
    for b, prompt in enumerate(prompts):
        _compare_greedy(ctx, label(b, prompts), prompt, got[b], got_logits[b], want[b],
                        want_logits[b], params, config, factor=1.0)


@check("generate.greedy_reference", entries=("generate", "greedy_token", "crop_context",
                                             "stop_condition"),
       ops=("generate",), depends_on=DEPENDS, area=AREA, budget=MODEL)
def greedy_reference(backend, ctx):
    """Greedy generation equals the reference's token for token, and each step's logits
    (computed however the backend likes: a KV cache) are within the model's budget of the
    reference's, which recomputes the full forward on the cropped context every step.
    Prompts longer than n_ctx and generations past n_ctx are included (cropping), and
    an end-of-text id stops a sequence."""
    @ctx.given(case=generation_cases(ctx.precision.dtype, GENERATION_SHARE))
    def _(case):
        _greedy_matches_reference(ctx, case, lambda b, prompts: f"sequence {b}")


# --- an engine that returns logits and nothing else: generation through its forward ---------


def judged_by_its_own(backend, op: str, check_id: str) -> None:
    """NotApplicable where the backend brings ``op`` itself: its own is judged (by
    ``check_id``), not the judge's loop over its logits."""
    if callable(getattr(backend, op, None)):
        raise NotApplicable(f"the backend has its own {op}, judged by {check_id}")


def _last_rows_of(ctx):
    """``forward`` for the reference's generation loop: a context (T,) to the backend's
    logits (T, V), its forward called on a batch of one."""
    def forward(tokens: np.ndarray, params, config) -> np.ndarray:
        out = np.asarray(ctx.backend.forward(np.asarray(tokens)[None], params, config),
                         dtype=np.float64)
        shape = (1, len(tokens), config.vocab_size)
        ctx.require(out.shape == shape, f"forward returned logits of shape {out.shape} for "
                                        f"tokens of shape {shape[:2]}, expected {shape}")
        return out[0]

    return forward


@check("greedy_token.through_forward", entries=("greedy_token", "generate", "crop_context",
                                                "stop_condition"),
       depends_on=DEPENDS, area=AREA, budget=MODEL)
def greedy_through_forward(backend, ctx):
    """Greedy decoding of an engine that returns logits and nothing else: the judge runs
    the spec's generation loop (the reference's ``generate``) over the backend's
    ``forward``, the last row's arg-max at every step, and the tokens equal the
    reference's token for token up to a near tie (the two best reference logits within
    the step's logits budget of each other), each step's logits within the model's
    budget of the reference's. The same cases as generate.greedy_reference: prompts
    longer than n_ctx, generation past n_ctx (cropping), contexts across kernel blocks,
    an end-of-text id. Not applicable to a backend with its own ``generate`` (judged by
    generate.greedy_reference)."""
    judged_by_its_own(backend, "generate", "generate.greedy_reference")

    @ctx.given(case=generation_cases(ctx.precision.dtype, GENERATION_SHARE))
    def _(case):
        _greedy_matches_reference(ctx, case, lambda b, prompts: f"sequence {b}",
                                  through_forward=True)


@check("kv_cache_attention.cache_vs_no_cache", entries=("kv_cache_attention", "generate"),
       ops=("generate",), depends_on=DEPENDS, kind="property", area=AREA,
       budget="twice the model's budget: both paths are within it of the same exact logits")
def cache_vs_no_cache(backend, ctx):
    """The KV-cache identity in the backend: the logits its generation step used equal
    its own forward pass over the whole (cropped) context within twice the model's budget,
    and the greedy token is that forward pass's arg-max (up to a near tie)."""
    @ctx.given(case=generation_cases(ctx.precision.dtype, GENERATION_SHARE))
    def _(case):
        config, params, prompts, max_new, _ = _fitted(backend, case)
        got, got_logits = _generate(ctx, prompts, params, config, max_new, temperature=0.0,
                                    return_logits=True)
        for b, prompt in enumerate(prompts):
            seq = list(prompt)
            rows = []
            for n in range(len(got[b])):
                context = ref.crop_context(seq, config.n_ctx)
                rows.append(np.asarray(backend.forward(np.asarray([context]), params, config),
                                       dtype=np.float64)[0, -1])
                seq.append(got[b][n])
            want = [int(np.argmax(r)) for r in rows]
            _compare_greedy(ctx, f"sequence {b} (cache vs forward)", prompt, got[b],
                            got_logits[b], want, rows, params, config, factor=2.0)


@check("generate.batch_invariance", entries="generate", ops=("generate",),
       depends_on=("generate.greedy_reference",), kind="property", area=AREA,
       budget="twice the model's budget (a batch may change the summation order)")
def batch_invariance(backend, ctx):
    """Batch invariance: a prompt generated alone and inside a batch of other prompts (of
    other lengths) gives the same greedy tokens (up to a near tie of its logits)."""
    @ctx.given(case=generation_cases(ctx.precision.dtype, GENERATION_SHARE))
    def _(case):
        config, params, prompts, max_new, eot = _fitted(backend, case)
        together, together_logits = _generate(ctx, prompts, params, config, max_new,
                                              temperature=0.0, eot_token=eot,
                                              return_logits=True)
        for b, prompt in enumerate(prompts):
            [alone], [alone_logits] = _generate(ctx, [prompt], params, config, max_new,
                                                temperature=0.0, eot_token=eot,
                                                return_logits=True)
            _compare_greedy(ctx, f"sequence {b} in a batch of {len(prompts)} vs alone",
                            prompt, together[b], together_logits[b], alone, alone_logits,
                            params, config, factor=2.0)


# --- every variant through the decoding step; ragged batches ------------------------------

VARIANT_ENTRIES = ("generate", "kv_cache_attention", "block_pre_ln", "block_post_ln",
                   "block_guide", "ffn_relu", "ffn_gelu", "ffn_gelu_tanh", "ffn_guide_product")


def variants(shift: int) -> list[tuple[str, str]]:
    """Every block form once, each with a different FFN: (NORMS[j], FFNS[(j + shift) % 4]).
    The four shifts together give all 12 combinations; any one gives every block form and
    three of the four FFNs, at a quarter of the cost of all 12."""
    return [(norm, FFNS[(j + shift) % len(FFNS)]) for j, norm in enumerate(NORMS)]


@st.composite
def decoding_cases(draw, dtype: str):
    """A base configuration (n_ctx 5–7, or with probability GENERATION_SHARE one big in
    one concern, e.g. n_ctx 63 … 1025) and its parameters' seed and scale, which
    variants to run, 1–2 prompts of one length L (n_ctx − 4 ≤ L ≤ n_ctx − 3), and
    n_ctx − L + 1 new tokens (4 or 5): at least two steps in which every sequence adds
    one token at one position (the uniform decoding step), then one past n_ctx
    (cropping). No end-of-text: every sequence runs to the length."""
    base = draw(configs(max_layers=2, max_ctx=7, max_vocab=16, ffns=("relu",), norms=("pre",),
                        share=GENERATION_SHARE).filter(lambda c: c.n_ctx >= 5))
    recipe = draw(parameter_recipes(base, dtype))
    shift = draw(st.integers(0, len(FFNS) - 1), label="variants shift")
    length = draw(st.integers(max(1, base.n_ctx - 4), base.n_ctx - 3), label="prompt length")
    n_prompts = draw(st.integers(1, 2), label="prompts")
    prompts = [draw(prompt_tokens(base.vocab_size, length, f"prompt {b}"))
               for b in range(n_prompts)]
    return base, recipe, variants(shift), prompts, base.n_ctx - length + 1


def _variant(base, norm: str, ffn: str):
    d_ff = base.d_model if ffn == "guide_product" else base.d_ff
    return dataclasses.replace(base, norm=norm, ffn=ffn, d_ff=d_ff)


@check("generate.every_variant", entries=VARIANT_ENTRIES, ops=("generate",),
       depends_on=DEPENDS, area=AREA, budget=MODEL)
def every_variant(backend, ctx):
    """Generation through the uniform decoding step, for every block (pre-LN, post-LN,
    the Guide's) and every FFN (ReLU, GELU, tanh-GELU, the Guide's product) the
    configuration allows.

    Precondition: 1–2 prompts of one length L ≤ n_ctx − 3 and n_ctx − L + 1 new tokens,
    no end-of-text, so that a backend with a KV cache takes at least two steps in which
    every sequence adds one token at one position (where step implementations
    specialise) before the context is cropped. Each example runs one drawn base
    configuration in three variants: every block form, each with another FFN (the
    drawn shift picks which; over the examples, all 12 combinations). For each, greedy
    generation equals the reference's token for token (up to a near tie), and each
    step's logits are within the model's budget of the reference's. A variant the
    backend declares not applicable is skipped; the example's others are still judged."""
    @ctx.given(case=decoding_cases(ctx.precision.dtype))
    def _(case):
        base, recipe, chosen, prompts, max_new = case
        applicable, not_applicable = 0, None
        for norm, ffn in chosen:
            config = _variant(base, norm, ffn)
            params = {k: B.round_to(v, ctx.precision.dtype)
                      for k, v in ParameterRecipe(config, recipe.scale, recipe.seed).make().items()}
            try:
                config, params = fit_to_backend(config, params, backend)
                got, got_logits = _generate(ctx, prompts, params, config, max_new,
                                            temperature=0.0, return_logits=True)
            except NotApplicable as err:
                # a variant the engine cannot express (GPT-2 has pre-LN blocks only): the
                # example's other variants are still judged; if none applies, neither does it
                not_applicable = err
                continue
            applicable += 1
            want, want_logits = ref.generate(prompts, params, config, max_new,
                                             temperature=0.0, return_logits=True)
            for b, prompt in enumerate(prompts):
                _compare_greedy(ctx, f"{norm}-LN block, {ffn} FFN: sequence {b}", prompt,
                                got[b], got_logits[b], want[b], want_logits[b], params,
                                config, factor=1.0)
        if not applicable and not_applicable is not None:
            raise not_applicable


@st.composite
def ragged_cases(draw, dtype: str):
    """A small model (n_ctx 4–8), 2–3 prompts of at least two different lengths, all
    shorter than n_ctx, new tokens up to past n_ctx, and maybe an end-of-text id. With
    probability GENERATION_SHARE the model is big in one concern; with a context past 8,
    one prompt ends 1–2 tokens below a block boundary b and is generated across it while
    a short one (1–8 tokens) runs beside it, maybe with a third just past b."""
    config = draw(configs(max_layers=2, max_ctx=8, max_vocab=16, share=GENERATION_SHARE)
                  .filter(lambda c: c.n_ctx >= 4))
    recipe = draw(parameter_recipes(config, dtype))
    params = {k: B.round_to(v, dtype) for k, v in recipe.make().items()}
    if config.n_ctx > 8:
        reached = [b for b in KERNEL_BLOCKS if b < config.n_ctx] or [config.n_ctx - 1]
        b = draw(st.sampled_from(reached), label="boundary crossed")
        k = draw(st.integers(1, 2), label="tokens below the boundary")
        lengths = [b - k, draw(st.integers(1, 8), label="short prompt")]
        if b + 1 < config.n_ctx and draw(st.booleans(), label="a third just past it"):
            lengths.append(b + 1)
        assume(len(set(lengths)) > 1)
        prompts = [draw(prompt_tokens(config.vocab_size, n, f"prompt {i}"))
                   for i, n in enumerate(lengths)]
        max_new = k + 2
    else:
        prompts = draw(ragged_prompts(config, max_prompts=3), label="prompts")
        max_new = draw(st.integers(2, config.n_ctx + 1), label="max_new_tokens")
    eot = draw(st.one_of(st.none(), st.integers(0, config.vocab_size - 1)), label="eot")
    return config, params, prompts, max_new, eot


@check("generate.ragged_batch", entries=("generate", "kv_cache_attention", "crop_context",
                                         "stop_condition"),
       ops=("generate",), depends_on=DEPENDS, area=AREA, budget=MODEL)
def ragged_batch(backend, ctx):
    """A batch of prompts of different lengths is generated as if each were alone (the
    spec's decision on generate): each position counted from the sequence's own start,
    no attention to another sequence's padding, each stopping and cropped on its own.

    Precondition: 2–3 prompts with at least two distinct lengths, all shorter than
    n_ctx (so the batch's first steps extend cached contexts of different lengths), and
    up to n_ctx + 1 new tokens; an end-of-text id stops some sequences early while the
    others go on. Every sequence's greedy tokens equal the reference's (which generates
    each prompt alone) up to a near tie, and each step's logits are within the model's
    budget of the reference's."""
    @ctx.given(case=ragged_cases(ctx.precision.dtype))
    def _(case):
        _greedy_matches_reference(
            ctx, case, lambda b, prompts: f"sequence {b} (length {len(prompts[b])}) of "
                                          f"lengths {[len(p) for p in prompts]}")


# --- the sampling distribution -----------------------------------------------------------------


def _sampling_precision(p: Precision) -> Precision:
    """Sampling runs in float32 at least (16-bit logits are widened first)."""
    return p if p.dtype in ("float64", "float32") else Precision.of("float32")


def _strictly_above(values: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """For each threshold, how many of ``values`` exceed it strictly."""
    return values.size - np.searchsorted(np.sort(values), thresholds, side="right")


def filter_certainty(y: np.ndarray, top_k: int | None, top_p: float | None,
                     sp: Precision, err: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray] | None:
    """Which tokens every correct implementation keeps (``certain_in``) and drops
    (``certain_out``), given logits y = z/τ known to within their rounding, or, where
    ``err`` is given, to within the budget of the error scale ``err`` (y computed from
    logits that are themselves only known to a budget). None where a top-k boundary is
    uncertain and a nucleus follows (its masses then depend on it)."""
    V = y.size
    certain_in = np.ones(V, dtype=bool)
    certain_out = np.zeros(V, dtype=bool)
    kept = np.ones(V, dtype=bool)
    if top_k is not None:
        if err is None:
            kth = np.sort(y)[::-1][min(top_k, V) - 1]
            # fl(·/τ) is monotone: a value ≥ z_(k) stays ≥; below by more than two
            # roundings of the threshold, it stays below
            certain_in &= y >= kth
            certain_out |= y < kth - 2 * sp.u * abs(kth) - sp.tiny
        else:
            # token i is kept when fewer than k others lie strictly above it: for certain
            # when fewer than k can (each y_j anywhere within its budget d_j, itself
            # excluded), dropped for certain when at least k must
            d = B.budget(err)
            certain_in &= _strictly_above(y + d, y - d) - (d > 0) < top_k
            certain_out |= _strictly_above(y - d, y + d) >= top_k
        if top_p is not None and not np.all(certain_in | certain_out):
            return None
        kept = certain_in.copy()
    if top_p is not None and top_p < 1:
        masked = np.where(kept, y, -np.inf)
        P, eP = B.softmax_bound(masked, np.where(kept, sp.u * np.abs(y) if err is None
                                                 else err, 0.0), sp)
        dP = B.budget(eP)
        d_mass = B.LAMBDA * (np.sqrt(np.sum(eP**2)) + sp.sum_scale(V))
        ids = np.arange(V)
        for i in np.flatnonzero(kept):
            others = kept & (ids != i)
            # may come before i: larger up to the roundings, or exactly equal with a lower id
            maybe_ahead = others & ((P > P[i]) | (np.abs(P - P[i]) <= dP + dP[i]))
            maybe_ahead &= ~((P == P[i]) & (ids > i))
            surely_ahead = others & ((P > P[i] + dP + dP[i]) | ((P == P[i]) & (ids < i)))
            if not np.sum(P[maybe_ahead]) < top_p - d_mass:
                certain_in[i] = False  # only kept when the mass before i is below p anyway
            if np.sum(P[surely_ahead]) >= top_p + d_mass:
                certain_out[i] = True
    return certain_in & ~certain_out, certain_out


def judge_distribution(ctx, q: np.ndarray, y: np.ndarray, settings: tuple, sp: Precision,
                       err: np.ndarray | None = None, what: str = "") -> None:
    """A distribution ``q`` drawn from with ``settings`` = (τ, top_k, top_p), τ > 0,
    against the spec's over y = z/τ (known to within its rounding in ``sp``, or to within
    the budget of the error scale ``err``): no negative or non-finite entry, every token
    kept for certain has positive probability (where its probability is visible at all),
    every token dropped for certain has none, and the probabilities are softmax(y)
    renormalised over q's own kept set within the softmax budget."""
    tau, top_k, top_p = settings
    where = f"τ={tau}, top_k={top_k}, top_p={top_p}"
    ctx.require(bool(np.all(q >= 0)) and bool(np.all(np.isfinite(q))),
                f"{what}the distribution has negative or non-finite entries ({where}): {q}")
    kept = q > 0
    certainty = filter_certainty(y, top_k, top_p, sp, err)
    if certainty is not None:
        certain_in, certain_out = certainty
        expected_in = ref.softmax(np.where(certain_in | kept, y, -np.inf))
        visible = certain_in & (expected_in > B.budget(sp.store(expected_in)))
        missing = np.flatnonzero(visible & ~kept)
        ctx.require(missing.size == 0, f"{what}token {missing[:1]} must be kept ({where}) "
                                       f"but has probability 0")
        extra = np.flatnonzero(certain_out & kept)
        ctx.require(extra.size == 0, f"{what}token {extra[:1]} must be dropped ({where}) but "
                                     f"has probability {q[extra[:1]]}")
    # the values over q's own set
    support = kept | (certainty[0] if certainty is not None else False)
    masked = np.where(support, y, -np.inf)
    e_y = sp.u * np.abs(y) if err is None else err
    expected, e = B.softmax_bound(masked, np.where(support, e_y, 0.0), sp)
    # e includes the storage rounding, but its quadrature sum underflows below ~1e-154
    bound = B.budget(np.maximum(e, sp.store(expected)))
    ctx.record(f"{what}probabilities over the kept set", B.compare(q, expected, bound))


# Temperatures of which z/τ is exact (powers of two) and ones of which it is not: only
# the latter show a backend that divides in the logits' 16-bit dtype (sampling runs in
# float32 at least). None below 0.5: arrays() draws logits up to half the dtype's range.
TEMPERATURES = st.one_of(st.sampled_from((0.0, 0.5, 1.0, 2.0)), st.sampled_from((0.7, 1.3)),
                         st.floats(0.5, 4.0))


@st.composite
def sampling_settings(draw, V: int):
    temperature = draw(TEMPERATURES, label="temperature")
    top_k = draw(st.one_of(st.none(), st.integers(1, V + 1)), label="top_k")
    top_p = draw(st.one_of(st.none(), st.sampled_from((0.1, 0.5, 0.9, 0.99, 1.0)),
                           st.floats(0.01, 1.0)), label="top_p")
    return temperature, top_k, top_p


FIXED_CASES = [
    ([2.0, 2.0, 2.0, 0.0], 1.0, 2, None),  # top-k keeps all three tied with the 2nd value
    ([0.0, 1.0, 1.0, 1.0, -1.0], 0.5, 1, None),
    (list(np.log([0.2, 0.5, 0.3])), 1.0, None, 0.6),  # 0.3 crosses p: kept
    (list(np.log([0.5, 0.3, 0.2])), 1.0, None, 0.75),
    ([0.0, 0.0, 0.0, 0.0], 1.0, None, 0.5),  # equal probabilities: the lower ids
    ([1.0, 3.0, 3.0, 0.0], 0.0, None, None),  # greedy: the first maximum
    ([1.0, 1.0, 1.0, 0.0, 0.0], 2.0, 4, 0.5),
]


@check("sampling_distribution.differential",
       entries=("sampling_distribution", "temperature_softmax", "top_k_filter",
                "nucleus_filter", "greedy_token"),
       ops=("sampling_distribution",), area=AREA,
       budget="the filters: exact off rounding-close boundaries; the values: softmax budget")
def sampling_distribution(backend, ctx):
    """The distribution the backend samples from, against the spec's, on the
    distribution itself (so no draw can leave the set, whatever the luck):

    * τ = 0: the one-hot of the lowest-id maximum, exactly;
    * every token the spec keeps for certain has positive probability and every token it
      drops for certain has probability exactly 0. "For certain" allows rounding only:
      top-k keeps all ties with the k-th value (exact ties in the input stay ties);
      the nucleus is the shortest prefix, by descending probability and then ascending
      id, whose mass reaches p — a token is uncertain only when its probability or the
      prefix mass is within the budget of another token's or of p;
    * equal logits are treated alike by top-k; by the nucleus, the lower id first;
    * the probabilities are softmax(z/τ) renormalised over the backend's own kept set,
      within the softmax budget."""
    p = ctx.precision
    sp = _sampling_precision(p)

    def one(z: np.ndarray, tau: float, top_k: int | None, top_p: float | None) -> None:
        V = z.size
        q = np.asarray(ctx.op("sampling_distribution")(z, tau, top_k, top_p), dtype=np.float64)
        ctx.require(q.shape == (V,), f"distribution of shape {q.shape}, expected {(V,)}")
        if tau == 0:
            ctx.record("greedy one-hot", B.exact(q, ref.sampling_distribution(z, 0.0)))
            return
        judge_distribution(ctx, q, z / tau, (tau, top_k, top_p), sp)
        kept = q > 0
        ties = [(i, j) for i in range(V) for j in range(i + 1, V) if z[i] == z[j]]
        for i, j in ties:
            if top_p is None or top_p >= 1:  # top-k alone: a threshold on values
                ctx.require(kept[i] == kept[j],
                            f"tokens {i} and {j} have equal logits, but only one is kept")
            else:
                ctx.require(kept[i] or not kept[j],
                            f"tokens {i} < {j} have equal logits; {j} is kept, {i} is not")

    # The cases the rules are about, every run: ties at the k-th value, the token that
    # crosses p, equal probabilities at the nucleus's edge, the lowest-id maximum.
    for z, tau, top_k, top_p in FIXED_CASES:
        one(B.round_to(np.array(z, dtype=np.float64), p.dtype), tau, top_k, top_p)

    @ctx.given(data=st.data())
    def _(data):
        V = data.draw(st.integers(2, 24), label="V")
        tied = st.lists(st.integers(-2, 2), min_size=V, max_size=V).map(
            lambda v: np.array(v, dtype=np.float64))  # exact ties: the tie rules matter
        z = B.round_to(data.draw(st.one_of(arrays((V,), p.dtype), tied), label="logits"),
                       p.dtype)
        one(z, *data.draw(sampling_settings(V)))


@check("sampling_distribution.through_forward",
       entries=("sampling_distribution", "temperature_softmax", "top_k_filter",
                "nucleus_filter"),
       depends_on=DEPENDS, area=AREA,
       budget="the model's logits budget at the context, divided by τ, carried through the "
              "filters (certain in/out) and the softmax")
def sampling_through_forward(backend, ctx):
    """The next-token distribution of an engine that returns logits and nothing else:
    the judge computes the spec's distribution (τ > 0, top-k, nucleus) from the last row
    of the backend's logits at the end of each prompt (cropped to n_ctx) and judges it
    against the reference logits', which the backend's are known to within the model's
    budget (budgets.gpt_forward_bound): every token kept for certain under that
    uncertainty is kept, every token dropped for certain is dropped, and the
    probabilities are the reference's softmax renormalised over the kept set within the
    softmax budget of logits off by up to that budget / τ. A shift of every logit by one
    constant leaves the distribution, and so this check, unchanged. Small models (V ≤
    16: certainty under a nucleus costs O(V²)). Not applicable to a backend with its
    own ``sampling_distribution`` (judged by sampling_distribution.differential)."""
    judged_by_its_own(backend, "sampling_distribution", "sampling_distribution.differential")
    p = ctx.precision
    wide = Precision.of("float64")  # the judge computes the distribution in float64
    forward = _last_rows_of(ctx)

    @ctx.given(case=generation_cases(p.dtype), data=st.data())
    def _(case, data):
        config, params, prompts, _, _ = _fitted(backend, case)
        for b, prompt in enumerate(prompts):
            context = ref.crop_context(prompt, config.n_ctx)
            tau, top_k, top_p = data.draw(sampling_settings(config.vocab_size)
                                          .filter(lambda s: s[0] > 0), label=f"settings {b}")
            z = forward(np.asarray(context), params, config)[-1]
            want = ref.gpt_forward(np.asarray(context), params, config)[-1]
            e_z = B.gpt_forward_bound(np.asarray([context]), params, config, p)[0, -1]
            y = want / tau
            q = ref.sampling_distribution(z, tau, top_k, top_p)
            judge_distribution(ctx, q, y, (tau, top_k, top_p), wide,
                               err=np.hypot(e_z / tau, wide.u * np.abs(y)),
                               what=f"prompt {b} (length {len(prompt)}): ")


# --- drawing --------------------------------------------------------------------------------


@check("sample_token.support", entries=("sample_token", "top_k_filter", "nucleus_filter"),
       ops=("generate",), depends_on=("sampling_distribution.differential",),
       kind="property", area=AREA, budget="the filters' certainty (see the distribution check)")
def sample_token_support(backend, ctx):
    """Every sampled token lies in the filtered set of the logits it was drawn from: no
    token that top-k or the nucleus drops for certain is ever drawn."""
    sp = _sampling_precision(ctx.precision)

    @ctx.given(case=generation_cases(ctx.precision.dtype), data=st.data())
    def _(case, data):
        config, params, prompts, max_new, eot = _fitted(backend, case)
        tau = data.draw(st.sampled_from((0.5, 1.0, 2.0, 0.7, 1.3)), label="temperature")
        # settings that drop tokens (else there is nothing to check)
        top_k, top_p = data.draw(st.tuples(st.one_of(st.none(), st.integers(1, 3)),
                                           st.sampled_from((None, 0.3, 0.6, 0.9)))
                                 .filter(lambda s: s != (None, None)), label="top_k, top_p")
        seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
        tokens, logits = _generate(ctx, prompts, params, config, max_new, temperature=tau,
                                   top_k=top_k, top_p=top_p, eot_token=eot,
                                   rng=np.random.default_rng(seed), return_logits=True)
        for b, seq in enumerate(tokens):
            for n, t in enumerate(seq):
                y = np.asarray(logits[b][n], dtype=np.float64) / tau
                certainty = filter_certainty(y, top_k, top_p, sp)
                if certainty is not None:
                    ctx.require(not certainty[1][t],
                                f"sequence {b}, step {n + 1}: drew token {t}, which "
                                f"top_k={top_k} / top_p={top_p} drop")


@check("generate.seeded", entries=("sample_token", "generate"), ops=("generate",),
       kind="property", area=AREA, budget="exact: the same seed gives the same tokens")
def seeded(backend, ctx):
    """With a fixed seed, sampling is reproducible: the same generator state gives the
    same tokens."""
    @ctx.given(case=generation_cases(ctx.precision.dtype), data=st.data())
    def _(case, data):
        config, params, prompts, max_new, eot = _fitted(backend, case)
        tau, top_k, top_p = data.draw(sampling_settings(config.vocab_size))
        seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
        options = dict(temperature=tau or 1.0, top_k=top_k, top_p=top_p, eot_token=eot)
        first, _ = _generate(ctx, prompts, params, config, max_new,
                             rng=np.random.default_rng(seed), **options)
        again, _ = _generate(ctx, prompts, params, config, max_new,
                             rng=np.random.default_rng(seed), **options)
        ctx.require(first == again, f"seed {seed} gave {first}, then {again}")
