"""Spec entries: sampling — turning next-token logits into text, one token at a time.

The Blueprint (sec. 4) fixes the loop: compute the next-token distribution, draw a token
(top-k or nucleus), append it, repeat until a length or end-of-text. These entries pin
down what it leaves open: the temperature, greedy's tie, which tokens top-k and nucleus
keep at ties, the filters' order, the seeded draw, a context outgrowing n_ctx, and why a
KV cache does not change the result. A selection (greedy, the filters, the draw, the
loop) means a small exact Python definition over sympy numbers; arithmetic (temperature,
the KV-cache identity) a sympy expression.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy as sp

from gptspec.spec.equation import Decision, Reading, Symbol, Tolerance, equation
from gptspec.spec.sources import (
    BLUEPRINT,
    FAN_2018,
    HOLTZMAN_2020,
    RADFORD_2019,
    VASWANI_2017,
    Source,
)


def _row(z) -> list:
    """The entries of a (1, n) sympy matrix (or any sequence) as a list."""
    return list(z) if not isinstance(z, sp.MatrixBase) else [z[0, j] for j in range(z.cols)]


def _descending_order(values: Sequence) -> list[int]:
    """Token ids by descending value; equal values by ascending id (the stated tie rule)."""
    return sorted(range(len(values)), key=lambda i: (-values[i], i))


# --- temperature and greedy ------------------------------------------------------------------


@equation(
    id="temperature_softmax",
    title="Temperature",
    group="sampling",
    latex=r"q_i = \frac{e^{z_i/\tau}}{\sum_{j=0}^{V-1} e^{z_j/\tau}}, \qquad \tau > 0",
    symbols=(
        Symbol("z", "(V,)", "next-token logits (the last row of the model's output)"),
        Symbol(r"\tau", "()", "temperature; τ < 1 sharpens, τ > 1 flattens, τ = 1 is the model"),
        Symbol("q", "(V,)", "the distribution sampled from"),
    ),
    sources=(Source(BLUEPRINT, "sec. 4, step 2"), Source(HOLTZMAN_2020, "sec. 3.3")),
    reference="temperature_softmax",
    tolerance=Tolerance(r"\lambda \sqrt{V}\,u", reduction="vocab_size",
                        note="a softmax of z/τ; the division by τ adds one rounding per entry"),
    decisions=(
        Decision(
            question="What does temperature 0 mean?",
            readings=(
                Reading(Source(HOLTZMAN_2020, "sec. 3.3"), "τ → 0 approaches greedy decoding"),
                Reading(Source(BLUEPRINT, "sec. 4"), "does not mention temperature"),
            ),
            decision="τ = 0 is greedy decoding (entry greedy_token); τ < 0 is an error.",
            why="As τ → 0⁺ the distribution tends to the uniform distribution over the "
                "arg-max set, a point mass when the maximum is unique; the greedy rule "
                "makes the tie case deterministic instead of dividing by zero.",
        ),
    ),
    sympy_inputs=(("z", "(1, V)"), ("tau", "() > 0")),
)
def temperature_softmax(z, tau=1):
    e = (z / tau).applyfunc(sp.exp)
    return e / sum(e)


@equation(
    id="greedy_token",
    title="Greedy decoding",
    group="sampling",
    latex=r"x_{T+1} = \min\,\{\, i : z_i = \max_j z_j \,\}",
    symbols=(Symbol("z", "(V,)", "next-token logits"),
             Symbol("x_{T+1}", "()", "the next token id")),
    sources=(Source(BLUEPRINT, "sec. 4, step 3"), Source(HOLTZMAN_2020, "sec. 2.1")),
    reference="greedy_token",
    decisions=(
        Decision(
            question="Which token does greedy decoding pick when several logits tie for the "
                     "maximum?",
            readings=(Reading(Source(BLUEPRINT, "sec. 4"),
                              "not stated (only sampling is described)"),),
            decision="The lowest token id among the maxima.",
            why="A deterministic rule that every backend can implement (first occurrence of "
                "the maximum); it is what numpy.argmax and torch.argmax return on CPU.",
        ),
    ),
    notes="Softmax is strictly increasing, so the arg-max of the logits is the arg-max of "
          "the distribution at any temperature.",
)
def greedy_token(z):
    values = _row(z)
    return sp.Integer(_descending_order(values)[0])


# --- the filters -----------------------------------------------------------------------------


@equation(
    id="top_k_filter",
    title="Top-k filtering",
    group="sampling",
    latex=(r"\operatorname{top}_k(z)_i = \begin{cases} z_i & z_i \ge z_{(k)} \\ -\infty & "
           r"\text{otherwise} \end{cases}, \quad z_{(k)} = \text{the } k\text{-th largest "
           r"entry of } z \text{ counted with multiplicity}"),
    symbols=(
        Symbol("z", "(V,)", "next-token logits (after the temperature)"),
        Symbol("k", "()", "how many of the most likely tokens to keep, 1 ≤ k; k ≥ V keeps all"),
    ),
    sources=(Source(FAN_2018, "top-k random sampling"), Source(HOLTZMAN_2020, "sec. 3.2"),
             Source(BLUEPRINT, "sec. 4, step 3")),
    reference="top_k_filter",
    decisions=(
        Decision(
            question="Which tokens does top-k keep when several logits tie with the k-th largest?",
            readings=(
                Reading(Source(FAN_2018, "top-k random sampling"),
                        "sample from the k most likely tokens (ties not discussed)"),
                Reading(Source(HOLTZMAN_2020, "sec. 3.2"),
                        "the top-k vocabulary V^(k) maximising the mass of k tokens "
                        "(not unique at a tie)"),
                Reading(Source(BLUEPRINT, "sec. 4, step 3"), "names top-k sampling only"),
            ),
            decision="Keep every token whose logit is ≥ the k-th largest logit z_(k) (counted "
                     "with multiplicity). The kept set has at least k tokens, more exactly when "
                     "tokens tie with z_(k); no token id order is involved.",
            why="A threshold on values is invariant under renaming the tokens, needs no "
                "tie-breaking order that backends would have to agree on, and is the "
                "behaviour of comparing against the k-th value returned by torch.topk.",
        ),
    ),
    notes="Applied to z/τ this keeps the same set as applied to z (division by τ > 0 keeps "
          "the order). Kept logits are unchanged; softmax renormalises them.",
)
def top_k_filter(z, k=1):
    values = _row(z)
    k = min(int(k), len(values))
    kth = sorted(values, reverse=True)[k - 1]
    return sp.Matrix([[v if v >= kth else -sp.oo for v in values]])


@equation(
    id="nucleus_filter",
    title="Nucleus (top-p) filtering",
    group="sampling",
    latex=(r"V^{(p)} = \{\pi(1), \dots, \pi(c)\}, \quad c = \min\Big\{ m : \sum_{j=1}^{m} "
           r"P_{\pi(j)} \ge p \Big\}, \quad \operatorname{nucleus}_p(z)_i = \begin{cases} "
           r"z_i & i \in V^{(p)} \\ -\infty & \text{otherwise} \end{cases}"),
    symbols=(
        Symbol("z", "(V,)", "next-token logits (after temperature and top-k)"),
        Symbol("P", "(V,)", "softmax(z)"),
        Symbol("p", "()", "the mass to reach, 0 < p ≤ 1"),
        Symbol(r"\pi", "(V,)", "token ids by descending P, equal P by ascending id"),
        Symbol("V^{(p)}", "set", "the nucleus: the token ids kept"),
        Symbol("c", "()", "the nucleus size: the fewest top tokens whose mass reaches p"),
    ),
    sources=(Source(HOLTZMAN_2020, "sec. 3.1, eq 2"), Source(BLUEPRINT, "sec. 4, step 3")),
    reference="nucleus_filter",
    decisions=(
        Decision(
            question="Is the token whose probability carries the mass past p in the nucleus?",
            readings=(
                Reading(Source(HOLTZMAN_2020, "sec. 3.1"),
                        r"the smallest $V^{(p)}$ with $\sum_{x \in V^{(p)}} P(x) \ge p$"),
                Reading(Source(BLUEPRINT, "sec. 4, step 3"), "names nucleus sampling only"),
            ),
            decision="Yes: the nucleus is the shortest prefix of π whose mass reaches (≥) p, "
                     "so the crossing token is included and the nucleus is never empty.",
            why="This is Holtzman et al.'s definition: the smallest set whose mass is at least "
                "p. Excluding the crossing token would leave a set of mass below p (empty when "
                "the top token alone exceeds p).",
        ),
        Decision(
            question="Which tokens make the nucleus when probabilities tie?",
            readings=(Reading(Source(HOLTZMAN_2020, "sec. 3.1"),
                              "not stated: the smallest set is not unique at a tie"),),
            decision="Order tokens by descending probability, equal probabilities by ascending "
                     "token id (a stable descending sort), and take the shortest prefix.",
            why="It keeps the set the smallest one (as the paper defines) and makes it unique; "
                "a stable descending sort, available in every backend, implements it.",
        ),
    ),
    notes="p = 1 keeps every token (the smallest set of mass 1 is the support; tokens outside "
          "it have probability 0 either way, so the distribution is the same).",
)
def nucleus_filter(z, p=1):
    values = _row(z)
    if p >= 1:
        return sp.Matrix([values])
    e = [sp.exp(v) for v in values]
    total = sum(e)
    probs = [x / total for x in e]
    keep: set[int] = set()
    mass = sp.Integer(0)
    for i in _descending_order(probs):
        keep.add(i)
        mass += probs[i]
        if mass >= p:
            break
    return sp.Matrix([[v if i in keep else -sp.oo for i, v in enumerate(values)]])


@equation(
    id="sampling_distribution",
    title="The distribution a token is drawn from",
    group="sampling",
    latex=(r"q = \operatorname{softmax}\big(\operatorname{nucleus}_p(\operatorname{top}_k(z/\tau))"
           r"\big) \quad (\tau > 0), \qquad q = e_{\operatorname{greedy}(z)} \quad (\tau = 0)"),
    symbols=(
        Symbol("z", "(V,)", "next-token logits"),
        Symbol(r"\tau", "()", "temperature ≥ 0"),
        Symbol("k", "()", "top-k (optional: omitted keeps all)"),
        Symbol("p", "()", "nucleus mass (optional: omitted means p = 1)"),
        Symbol("q", "(V,)", "the distribution the next token is drawn from"),
        Symbol("e_v", "(V,)", "the one-hot vector of token v"),
    ),
    sources=(Source(BLUEPRINT, "sec. 4, steps 2–3"), Source(HOLTZMAN_2020, "sec. 3"),
             Source(RADFORD_2019, "sec. 3 (top-k sampling with k = 40 for samples)")),
    reference="sampling_distribution",
    tolerance=Tolerance(r"\lambda\,p_v\left((4 + s_V)\,u \oplus u\,\left|\frac{z_v - \max_{v'} "
                        r"z_{v'}}{\tau}\right|\right)\ \text{off the filters' boundaries}",
                        reduction="vocab_size",
                        note="off the filters' boundaries, softmax's budget over the kept logits divided "
                             "by τ; the kept set itself is exact away from ties and from cumulative mass "
                             "within rounding of p, where a token may go either way; its check: the "
                             "filters: exact off rounding-close boundaries; the values: softmax budget"),
    decisions=(
        Decision(
            question="In which order do temperature, top-k and nucleus apply when combined?",
            readings=(
                Reading(Source(HOLTZMAN_2020, "sec. 3"), "each is described on its own"),
                Reading(Source(BLUEPRINT, "sec. 4, step 3"), "top-k or nucleus, one of them"),
            ),
            decision="Temperature first, then top-k, then the nucleus of the renormalised top-k "
                     "distribution, then softmax.",
            why="Top-k's set does not depend on τ, but the nucleus does (τ moves mass), so the "
                "nucleus is taken of the distribution actually sampled from; this is also the "
                "order of Hugging Face transformers' logits warpers, so the same settings mean "
                "the same thing there.",
        ),
    ),
)
def sampling_distribution(z, tau=1, k=None, p=None):
    values = _row(z)
    if tau == 0:
        best = int(greedy_token.sympy(values))
        return sp.Matrix([[1 if i == best else 0 for i in range(len(values))]])
    z = sp.Matrix([values]) / tau
    if k is not None:
        z = top_k_filter.sympy(z, k)
    if p is not None:
        z = nucleus_filter.sympy(z, p)
    e = z.applyfunc(sp.exp)  # exp(−∞) = 0: filtered tokens get no mass
    return e / sum(e)


@equation(
    id="sample_token",
    title="Drawing a token",
    group="sampling",
    latex=r"x_{T+1} = \min\Big\{ i : \sum_{j=0}^{i} q_j > u \Big\}, \qquad u \sim U[0, 1)",
    symbols=(
        Symbol("q", "(V,)", "the sampling distribution"),
        Symbol("u", "()", "one uniform draw from the seeded generator"),
        Symbol("x_{T+1}", "()", "the next token id"),
        Symbol("U[0, 1)", "distribution", "the uniform distribution on [0, 1)"),
    ),
    sources=(Source(BLUEPRINT, "sec. 4, step 3"),),
    reference="sample_token",
    decisions=(
        Decision(
            question="How is a token drawn, so that a seed fixes the result?",
            readings=(Reading(Source(BLUEPRINT, "sec. 4, step 3"),
                              "'a token is sampled from this distribution'"),),
            decision="Inverse transform: one uniform u ∈ [0, 1) per token from an explicitly "
                     "seeded generator; the token is the first id whose cumulative mass exceeds u.",
            why="The strict '>' never selects a token of probability 0 (its cumulative mass "
                "equals its predecessor's), so draws lie in the filtered set by construction; "
                "the same seed gives the same u and hence the same token.",
        ),
    ),
    notes="Backends may draw with their own generator (e.g. torch.multinomial); what they must "
          "share is the distribution q and its support, and reproducibility for a fixed seed.",
)
def sample_token(q, u=sp.S.Half):
    mass = sp.Integer(0)
    probs = _row(q)
    for i, q_i in enumerate(probs):
        mass += q_i
        if mass > u:
            return sp.Integer(i)
    # Rounding can leave the total just below 1: fall back to the last token with mass.
    return sp.Integer(max(i for i, q_i in enumerate(probs) if q_i > 0))


# --- the loop ----------------------------------------------------------------------------------


@equation(
    id="kv_cache_attention",
    title="KV-cache identity",
    group="sampling",
    latex=(r"\operatorname{softmax}\!\Big(\frac{q_t K_{1:t}^\top}{\sqrt{d_k}}\Big) V_{1:t} "
           r"= \Big[\operatorname{softmax}\!\Big(\frac{Q K^\top}{\sqrt{d_k}} + M\Big) V\Big]_t"),
    symbols=(
        Symbol("q_t", "(1, d_k)", "the query of the new token at position t"),
        Symbol("K_{1:t}", "(t, d_k)", "the cached keys of positions 1…t (t's own appended)"),
        Symbol("V_{1:t}", "(t, d_k)", "the cached values of positions 1…t"),
        Symbol("Q, K, V", "(T, d_k)", "the queries, keys and values of the whole sequence"),
        Symbol("M", "(T, T)", "the causal mask, M_{ij} = −∞ for j > i"),
    ),
    sources=(Source(BLUEPRINT, "eq 3 and sec. 4, step 4"), Source(VASWANI_2017, "sec. 3.2.1")),
    reference="kv_cache_attention",
    tolerance=Tolerance(r"2\lambda\,\varepsilon_Z",
                        reduction="n_ctx",
                        note="ε_Z is gpt_forward's error scale at each step's context: the cached and "
                             "the uncached paths each lie within λ·ε_Z of the same exact logits, "
                             "whatever their summation orders; its check: twice the model's budget: both "
                             "paths are within it of the same exact logits"),
    notes="Row t of masked attention reads only keys and values of positions ≤ t (M sets the "
          "others' weights to exp(−∞) = 0), and the keys and values of a position depend only "
          "on tokens at or before it (causality of every layer). So a generation step may keep "
          "each layer's K and V from earlier steps and compute only the new row: the logits "
          "equal those of the full forward on the whole context. The identity holds while "
          "positions do not move, i.e. until the context is cropped (crop_context). In a "
          "batch of sequences of different lengths t_b, the identity holds per sequence: "
          "the new token of sequence b sits at position t_b (its own length, not the "
          "batch's longest) and attends to exactly its own cached positions 0…t_b; slots "
          "that padding fills are never attended (see generate).",
    sympy_inputs=(("q", "(1, m)"), ("K", "(n, m)"), ("V", "(n, m)")),
)
def kv_cache_attention(q, K, V):
    scores = (q * K.T) / sp.sqrt(K.cols)
    e = scores.applyfunc(sp.exp)
    return (e / sum(e)) * V


@equation(
    id="crop_context",
    title="Cropping the context at n_ctx",
    group="sampling",
    latex=r"\operatorname{crop}(x_{1:T}) = x_{\max(1,\, T - n_{\mathrm{ctx}} + 1):T}",
    symbols=(
        Symbol("x", "(T,)", "the token sequence so far (prompt and generated tokens)"),
        Symbol(r"n_{\mathrm{ctx}}", "()", "the context length: the number of learned positions"),
    ),
    sources=(Source(BLUEPRINT, "sec. 2.1 (positions 1…n_ctx) and sec. 4, step 4"),
             Source(RADFORD_2019, "sec. 2.3 (context of 1024 tokens)")),
    reference="crop_context",
    decisions=(
        Decision(
            question="What does the model see once the sequence is longer than n_ctx?",
            readings=(Reading(Source(BLUEPRINT, "sec. 4, step 4"),
                              "'this new sequence becomes the context' (no limit stated), "
                              "while W_P has only n_ctx rows"),),
            decision="The last n_ctx tokens, at positions 0…n_ctx−1. A prompt longer than n_ctx "
                     "is cropped the same way (the command line warns).",
            why="The positional embedding is defined only for n_ctx positions; keeping the most "
                "recent tokens keeps the ones the next token depends on most directly.",
        ),
    ),
    notes="After cropping every token moves one position left, so cached keys and values "
          "(computed at the old positions) no longer apply: a cached implementation recomputes.",
)
def crop_context(x, n_ctx=1):
    x = list(x)
    return x[max(0, len(x) - int(n_ctx)):]


@equation(
    id="stop_condition",
    title="Stopping",
    group="sampling",
    latex=r"\text{stop after step } n \iff x_{T+n} = \texttt{<|endoftext|>} \ \lor\ n = N",
    symbols=(
        Symbol("n", "()", "the number of tokens generated so far"),
        Symbol("N", "()", "the most new tokens asked for"),
        Symbol("x_{T+n}", "()", "the n-th generated token"),
    ),
    sources=(Source(BLUEPRINT, "sec. 4, step 5"),),
    reference="stop_condition",
    decisions=(
        Decision(
            question="Is the end-of-text token part of the output?",
            readings=(Reading(Source(BLUEPRINT, "sec. 4, step 5"),
                              "'until … an end-of-sequence token is generated'"),),
            decision="It is generated (it is in the returned tokens, as the last one) and "
                     "generation of that sequence stops; text output leaves it out.",
            why="The tokens then record why a sequence stopped; the text is what the model "
                "wrote before it ended the document.",
        ),
    ),
    notes="Each sequence of a batch stops on its own condition. Without an end-of-text token "
          "(a tokenizer that has none) only the length stops.",
)
def stop_condition(token, n, max_new_tokens, eot_token=None):
    return (eot_token is not None and token == eot_token) or n >= max_new_tokens


@equation(
    id="generate",
    title="The generation loop",
    group="sampling",
    latex=(r"x_{T+n} \sim q\big(f_\theta(\operatorname{crop}(x_{1:T+n-1}))_{\text{last}}\big), "
           r"\quad n = 1, 2, \dots \text{ until stop}"),
    symbols=(
        Symbol("x_{1:T}", "(T,)", "the prompt; x_{T+n} is the n-th generated token"),
        Symbol(r"f_\theta", "(T,) → (T, V)", "the model's forward pass (gpt_forward)"),
        Symbol("q", "(V,) → (V,)", "sampling_distribution with the chosen τ, k, p"),
        Symbol("n", "()", "the step: x_{T+n} is the token it generates"),
    ),
    sources=(Source(BLUEPRINT, "sec. 4, steps 1–5 and eq 1"),),
    reference="generate",
    decisions=(
        Decision(
            question="What does generating a batch of prompts of different lengths mean?",
            readings=(Reading(Source(BLUEPRINT, "sec. 4, steps 1–5"),
                              "the loop for one sequence; batches are not discussed"),),
            decision="Each sequence as if generated alone: the tokens (and logits) of "
                     "prompt b in a batch are those of generate on prompt b by itself. "
                     "Positions count from each sequence's own first token, each stops on "
                     "its own condition, and each is cropped on its own. Padding (left or "
                     "right), row order, the cache's layout and which steps share a forward "
                     "call are implementation details. With sampling, how the draws of "
                     "one seeded generator are shared among the sequences is the "
                     "backend's (the same seed reproduces its tokens); each draw still "
                     "comes from that sequence's own distribution.",
            why="A batch is a way to use the hardware, not a different model: a prompt "
                "must not get other text for having neighbours.",
        ),
    ),
    notes="This is the definition: the full forward pass recomputed on the (cropped) context "
          "at every step, no cache. A cached implementation must give the same logits within "
          "rounding (kv_cache_attention) and, for greedy decoding, the same tokens.",
)
def generate(prompt, next_logits: Callable | None = None, max_new_tokens=1, n_ctx=1,
             tau=0, k=None, p=None, draws: Sequence | None = None, eot_token=None):
    x = list(prompt)
    for n in range(1, int(max_new_tokens) + 1):
        assert next_logits is not None, "the loop needs the model's next-token logits"
        z = next_logits(crop_context.sympy(x, n_ctx))
        q = sampling_distribution.sympy(z, tau, k, p)
        u = draws[n - 1] if draws is not None else sp.Rational(1, 2)
        token = int(sample_token.sympy(q, u))
        x.append(token)
        if stop_condition.sympy(token, n, max_new_tokens, eot_token):
            break
    return x[len(prompt):]
