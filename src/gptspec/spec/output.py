"""Spec entries: output — final LayerNorm, unembedding, next-token distribution, sequence
probability, and the whole forward pass composed from the other entries."""

from __future__ import annotations

from collections.abc import Sequence

import sympy as sp

from gptspec.spec.attention import SOFTMAX_RANGE, linear, softmax
from gptspec.spec.block import BLOCK, DEFAULT_EPS, layer_norm
from gptspec.spec.config import GPTConfig
from gptspec.spec.embedding import (
    EMBEDDING_DIMENSIONS,
    ROW_VECTORS,
    input_representation,
    positional_embedding,
    token_embedding,
)
from gptspec.spec.equation import Decision, Reading, Symbol, Tolerance, equation
from gptspec.spec.sources import (
    BLUEPRINT,
    BROWN_2020,
    GUIDE,
    NOTES,
    RADFORD_2019,
    VASWANI_2017,
    Source,
)

FINAL_NORM = Decision(
    question="Is there a LayerNorm after the last block?",
    readings=(
        Reading(Source(RADFORD_2019, "sec. 2.3"),
                "yes: 'an additional layer normalization was added after the final "
                "self-attention block'"),
        Reading(Source(BROWN_2020, "sec. 2.1"), "as GPT-2"),
        Reading(Source(BLUEPRINT, "eq 9"),
                r"no: $H_{\mathrm{out}}$ of the last (post-LN) block goes straight to $W_e^\top$"),
        Reading(Source(GUIDE, "sec. 6"), "no: the last layer's H (already normalised) is "
                              "projected"),
    ),
    decision="config.final_norm: true for the GPT-2 presets (pre-LN needs it: nothing else "
             "normalises the residual stream), false for the blueprint and guide presets "
             "(their blocks end in a LayerNorm).",
    why="Each document's model is reproduced as written; the final LayerNorm matters exactly "
        "when the last block does not end with one.",
)


@equation(
    id="final_layer_norm",
    title="Final LayerNorm",
    group="output",
    latex=r"H_f = \operatorname{LN}_f(H^{(L)}) = \gamma_f \odot \frac{H^{(L)} - \mu}"
          r"{\sqrt{\sigma^2 + \varepsilon}} + \beta_f",
    symbols=(
        Symbol("H^{(L)}", "(T, d_model)", "the residual stream after the last block"),
        Symbol(r"\gamma_f", "(d_model,)", "ln_f.weight"),
        Symbol(r"\beta_f", "(d_model,)", "ln_f.bias"),
        Symbol(r"\varepsilon", "()", "config.ln_eps"),
        Symbol("H_f", "(T, d_model)", "normalised final rows"),
        Symbol(r"\operatorname{LN}_f", "(T, d_model) → (T, d_model)", "the final LayerNorm (ln_f)"),
        Symbol(r"\mu, \sigma^2", "(T,)", "each row's mean and (biased) variance"),
    ),
    sources=(Source(RADFORD_2019, "sec. 2.3"), Source(BROWN_2020, "sec. 2.1"),
             Source(NOTES, "sec. 4.1")),
    reference="final_layer_norm",
    tolerance=Tolerance(r"\lambda\left(|\gamma_f|\,\delta\hat x \oplus u\,(|\gamma_f\,\hat x| + "
                        r"|\beta_f|) \oplus u\,|y|\right),\quad \delta\hat x = \frac{u\,|x - "
                        r"\mu| \oplus s_n\,\overline{|x|}}{\rho} \oplus |\hat x|\left(\frac{(s_n "
                        r"+ 2u)\,\sigma^2}{2\rho^2} \oplus 2u\right) \oplus u\,|\hat x|,\quad "
                        r"\rho = \sqrt{\sigma^2 + \varepsilon}",
                        reduction="d_model",
                        note="layer_norm's budget with γ_f and β_f; its check: as layer_norm"),
    decisions=(FINAL_NORM,),
    sympy_inputs=(("H", "(T, d_model)"), ("gamma", "(1, d_model)"), ("beta", "(1, d_model)"),
                  ("eps", "() > 0")),
)
def final_layer_norm(H: sp.Matrix, gamma: sp.Matrix, beta: sp.Matrix,
                     eps: sp.Expr = DEFAULT_EPS) -> sp.Matrix:
    return layer_norm.sympy(H, gamma, beta, eps)


TYING = Decision(
    question="Is the output map the embedding matrix, and does it have a bias?",
    readings=(
        Reading(Source(BLUEPRINT, "eq 9"),
                r"tied: $\operatorname{softmax}(H_{\mathrm{out}}^{(t-1)} W_e^\top)$, no bias"),
        Reading(Source(NOTES, "sec. 1.2 (unembedding)"),
                r"an unembedding $W_U$, often constrained to be $W_E^\top$"),
        Reading(Source(VASWANI_2017, "sec. 3.4"), "the embedding and pre-softmax weights are "
                                     "shared"),
        Reading(Source(RADFORD_2019, "sec. 2.3 (released code)"), "tied, no bias"),
        Reading(Source(GUIDE, "sec. 6"), r"its own weight and a bias: $W H + b$"),
    ),
    decision="config.tied_embeddings: tied (logits = H W_E^T, no bias; the default and the "
             "GPT-2 and blueprint presets) or untied with its own W_U of shape (d_model, V) "
             "and, with config.output_bias, a bias b_U (the guide preset).",
    why="Both appear in the documents and both are cheap to keep; tying is what GPT-2's "
        "checkpoints need, the Guide's model is untied with a bias.",
)


@equation(
    id="unembed_tied",
    title="Unembedding, tied to the embedding",
    group="output",
    latex=r"Z = H_f\, W_E^\top, \qquad Z_{t v} = \sum_{i=1}^{d_{\mathrm{model}}} (H_f)_{t i}"
          r"\,(W_E)_{v i}",
    symbols=(
        Symbol("H_f", "(T, d_model)", "final rows"),
        Symbol("W_E", "(V, d_model)", "the token embedding (wte), reused"),
        Symbol("Z", "(T, V)", "logits: row t scores every token as x_{t+1}"),
    ),
    sources=(Source(BLUEPRINT, "eq 9"), Source(NOTES, "sec. 1.2"),
             Source(VASWANI_2017, "sec. 3.4"), Source(RADFORD_2019, "sec. 2.3")),
    reference="unembed_tied",
    tolerance=Tolerance(r"\lambda\left(\sqrt{d_{\mathrm{model}}}\,u\,|H_f|\,|W_E|^\top \oplus "
                        r"u\,|Z|\right)",
                        reduction="d_model",
                        note="linear's budget with x = H_f, W = W_Eᵀ, no bias and y = Z, n = d_model; "
                             "its check: λ·(√n·u·(|x||W| + |b|) ⊕ u|y|), n = d_in (+1 for the bias), W = "
                             "W_Eᵀ"),
    decisions=(TYING, EMBEDDING_DIMENSIONS),
    sympy_inputs=(("H", "(T, d_model)"), ("W_E", "(V, d_model)")),
)
def unembed_tied(H: sp.Matrix, W_E: sp.Matrix) -> sp.Matrix:
    return H * W_E.T


GUIDE_OUTPUT = Decision(
    question="How many output projections are there?",
    readings=(
        Reading(Source(GUIDE, "sec. 6"),
                r"two: $O = W \times H + b$, then $P(y \mid x) = \operatorname{softmax}(W "
                r"\times O + b)$"
                r" with the same $W$ and $b$"),
        Reading(Source(BLUEPRINT, "eq 9"), r"one: $\operatorname{softmax}(H W_e^\top)$"),
        Reading(Source(RADFORD_2019, "sec. 2.3"), "one (tied)"),
    ),
    decision=r"One projection: logits $= H W_U + b_U$, then softmax. The Guide's second "
             r"$W \times O + b$ is read as a slip.",
    why=r"$W$ maps $d_{\mathrm{model}}$ to $V$, so $O$ has $V$ entries and $W \times O$ is "
        r"undefined unless $V = d_{\mathrm{model}}$: the double projection is dimensionally "
        r"inconsistent. Its first line already is the output layer the text describes "
        r"('projects it back into the vocabulary space').",
)


@equation(
    id="unembed_untied",
    title="Unembedding, untied with bias (Guide)",
    group="output",
    latex=r"Z = H_f\, W_U + b_U",
    symbols=(
        Symbol("H_f", "(T, d_model)", "final rows"),
        Symbol("W_U", "(d_model, V)", "w_u"),
        Symbol("b_U", "(V,)", "b_u (if config.output_bias)"),
        Symbol("Z", "(T, V)", "logits"),
    ),
    sources=(Source(GUIDE, "sec. 6"), Source(NOTES, "sec. 1.2 (unembedding)")),
    reference="unembed_untied",
    tolerance=Tolerance(r"\lambda\left(\sqrt{d_{\mathrm{model}}}\,u\,(|H_f|\,|W_U| + |b_U|) "
                        r"\oplus u\,|Z|\right)",
                        reduction="d_model",
                        note="linear's budget with x = H_f, W = W_U, b = b_U and y = Z, n = d_model; its "
                             "check: λ·(√n·u·(|x||W| + |b|) ⊕ u|y|), n = d_in (+1 for the bias)"),
    decisions=(GUIDE_OUTPUT, TYING, ROW_VECTORS),
    sympy_inputs=(("H", "(T, d_model)"), ("W_U", "(d_model, V)"), ("b_U", "(1, V)")),
)
def unembed_untied(H: sp.Matrix, W_U: sp.Matrix, b_U: sp.Matrix | None = None) -> sp.Matrix:
    return linear.sympy(H, W_U, b_U)


@equation(
    id="next_token_distribution",
    title="Next-token distribution",
    group="output",
    latex=r"P(x_{t+1} = v \mid x_1, \ldots, x_t) = \operatorname{softmax}(Z_{t,:})_v",
    symbols=(
        Symbol("Z", "(T, V)", "logits"),
        Symbol("P", "(T, V)", "row t: the distribution of the token after position t"),
        Symbol("x", "(T,)", "token ids; x_t is the token at position t"),
    ),
    sources=(Source(BLUEPRINT, "eq 9"), Source(GUIDE, "sec. 6"), Source(NOTES, "sec. 1.2"),
             Source(RADFORD_2019, "sec. 2")),
    reference="next_token_distribution",
    tolerance=Tolerance(r"\lambda\,P_{t v}\left((4 + s_V)\,u \oplus u\,|Z_{t v} - \max_{v'} Z_{t "
                        r"v'}|\right)",
                        reduction="V",
                        note="softmax's budget over a row of V logits; its check: λ·y·((4 + s(n))·u ⊕ "
                             "u|z − max z|), n = row length, s(n) = max(√n, (n − 1)/λ) (a sum of n terms "
                             "of one sign)"),
    decisions=(
        GUIDE_OUTPUT,
        SOFTMAX_RANGE,
        Decision(
            question="Which row predicts which token?",
            readings=(
                Reading(Source(BLUEPRINT, "eq 9"),
                        r"$P(x_t \mid x_{<t}) = "
                        r"\operatorname{softmax}(H_{\mathrm{out}}^{(t-1)} W_e^\top)$"),
                Reading(Source(GUIDE, "sec. 6"), r"$P(y \mid x)$, no index"),
            ),
            decision="Row t of the logits (positions counted from 1) is the distribution of "
                     "x_{t+1} given x_1 … x_t; the last row predicts the token after the "
                     "sequence.",
            why="The Blueprint's index t − 1 says the same thing; with causal attention row t "
                "sees exactly x_1 … x_t.",
        ),
    ),
    sympy_inputs=(("Z", "(T, V)"),),
)
def next_token_distribution(Z: sp.Matrix) -> sp.Matrix:
    return softmax.sympy(Z)


@equation(
    id="sequence_log_probability",
    title="Sequence log-probability",
    group="output",
    latex=r"\log P(x_2, \ldots, x_T \mid x_1) = \sum_{t=2}^{T} \log P(x_t \mid x_{<t})"
          r" = \sum_{t=2}^{T} \log \operatorname{softmax}(Z_{t-1,:})_{x_t}",
    symbols=(
        Symbol("x", "(T,)", "token ids"),
        Symbol("Z", "(T, V)", "logits of the sequence; row t − 1 predicts x_t"),
        Symbol("P", "(T, V)", "the model's next-token distribution (next_token_distribution)"),
    ),
    sources=(Source(BLUEPRINT, "eq 1"), Source(GUIDE, "sec. 7"),
             Source(RADFORD_2019, "sec. 2")),
    reference="sequence_log_probability",
    tolerance=Tolerance(r"\lambda\left(\sqrt{\textstyle\sum_{t=2}^{T}\big(u\,(|Z_{t-1, x_t} - "
                        r"m_{t-1}| + \ell_{t-1} + 4) + s_V\big)^2} + s_{T-1}\sum_{t=2}^{T} |\log "
                        r"P(x_t \mid x_{<t})| \oplus u\,|y|\right)",
                        reduction="V",
                        note="m_t is row t's largest logit and ℓ_t = log Σ_v exp(Z_{t v} − m_t); each "
                             "log P rounds in the shift, the exponentials, the logarithm and the "
                             "subtraction, and its normaliser is a sum of V positive terms; the sum over "
                             "t adds T − 1 terms of one sign; s_n = max(√n, (n − 1)/λ)·u is the error "
                             "scale of such a sum of n terms; y may be stored in the dtype; its check: "
                             "λ·(√Σ_t (u(|z_t − max| + lse + 4) + s(V))² + s(T − 1)·Σ|log p| ⊕ u·|y|), "
                             "s(n) a sum of n terms of one sign"),
    decisions=(
        Decision(
            question="Is the first token predicted?",
            readings=(
                Reading(Source(BLUEPRINT, "eq 1"),
                        r"$P(X) = \prod_{t=1}^{T} P(x_t \mid x_1, \ldots, x_{t-1})$, which "
                        r"includes an unconditional $P(x_1)$"),
                Reading(Source(GUIDE, "sec. 7"),
                        r"$-\sum_{i=1}^{T} \log P(y_i \mid x_{1:i-1})$, also from $i = 1$"),
                Reading(Source(RADFORD_2019, "sec. 2"),
                        "the model gives p(s_n | s_1, …, s_{n−1}) from a context"),
            ),
            decision=r"The log-probability of $x_2 \ldots x_T$ given $x_1$: the model has no row "
                     r"that predicts $x_1$. To score $x_1$ too, prepend a start token (GPT-2's "
                     r"<|endoftext|>) and score the longer sequence.",
            why="A decoder-only model conditions every prediction on at least one token; "
                "P(x_1) would need a separate unconditional model, which none of the "
                "documents defines.",
        ),
    ),
    sympy_inputs=(("x", "(T,) int < V"), ("Z", "(T, V)")),
)
def sequence_log_probability(x: Sequence[int], Z: sp.Matrix) -> sp.Expr:
    P = softmax.sympy(Z)
    return sum((sp.log(P[t - 1, x[t]]) for t in range(1, len(x))), sp.Integer(0))


def _block_parameters(params: dict[str, sp.Matrix], layer: int) -> dict[str, sp.Matrix]:
    prefix = f"blocks.{layer}."
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


@equation(
    id="gpt_forward",
    title="The forward pass",
    group="output",
    latex=r"Z = f_\theta(x):\quad H^{(0)} = E + P, \quad H^{(l)} = \operatorname{Block}_l(H^{(l-1)}),"
          r"\quad Z = \operatorname{Unembed}\!\left(\operatorname{LN}_f(H^{(L)})\right)",
    symbols=(
        Symbol("x", "(T,)", "token ids, T ≤ n_ctx"),
        Symbol(r"\theta", "params", "every parameter of the canonical schema"),
        Symbol(r"f_\theta", "(T,) → (T, V)", "the model with parameters θ"),
        Symbol("E", "(T, d_model)", "token embeddings of x"),
        Symbol("P", "(T, d_model)", "positional embeddings of positions 1 … T"),
        Symbol("H^{(l)}", "(T, d_model)", "the residual stream after block l (l = 0: before the first)"),
        Symbol(r"\operatorname{LN}_f", "(T, d_model) → (T, d_model)", "the final LayerNorm (ln_f)"),
        Symbol("Z", "(T, V)", "logits"),
    ),
    sources=(Source(BLUEPRINT, "secs. 2.1–2.3, eqs 2–9"), Source(GUIDE, "secs. 2–6"),
             Source(NOTES, "Architecture Onboarding: component map"),
             Source(RADFORD_2019, "sec. 2.3"), Source(BROWN_2020, "sec. 2.1")),
    reference="gpt_forward",
    tolerance=Tolerance(r"\lambda\,\varepsilon_Z,\quad \varepsilon_Z = "
                        r"\sqrt{d_{\mathrm{model}}}\,u\,(|H_f|\,|W_U| + |b_U|) \oplus "
                        r"\sqrt{\varepsilon_{H_f}^2\,W_U^2} \oplus u\,|Z|,\quad "
                        r"\varepsilon_{H^{(l)}} = \varepsilon_{\mathrm{Block}_l}(H^{(l-1)}, "
                        r"\varepsilon_{H^{(l-1)}}),\quad \varepsilon_{H^{(0)}} = u\,|E + P|",
                        reduction="d_ff",
                        note="every stage's error scale: the input sum's rounding, each block's budget "
                             "given its input's error (block_pre_ln's), the final LayerNorm's, then the "
                             "unembedding's (linear's budget, W_U = W_Eᵀ without a bias when tied); the "
                             "multiplier λ applies once, to the logits' scale; its check: every stage's "
                             "roundings propagated through the model (budgets.gpt_forward_bound)"),
    decisions=(FINAL_NORM, TYING),
    notes="Block_l is block_pre_ln, block_post_ln or block_guide (config.norm); P only with "
          "config.positional_embedding (H⁽⁰⁾ = E without it: the Guide); LN_f only with "
          "config.final_norm; Unembed is unembed_tied or unembed_untied (config.tied_embeddings).",
    sympy_inputs=(("x", "(T,) int < V"), ("params", "params"), ("config", "config")),
)
def gpt_forward(x: Sequence[int], params: dict[str, sp.Matrix], config: GPTConfig) -> sp.Matrix:
    H = token_embedding.sympy(x, params["wte"])
    if config.positional_embedding:  # the Guide as written has none: H⁽⁰⁾ = E
        H = input_representation.sympy(H, positional_embedding.sympy(len(x), params["wpe"]))
    for layer in range(config.n_layers):
        H = BLOCK[config.norm].sympy(H, _block_parameters(params, layer), config)
    if config.final_norm:
        H = final_layer_norm.sympy(H, params["ln_f.weight"], params["ln_f.bias"],
                                   sp.Rational(config.ln_eps))
    if config.tied_embeddings:
        return unembed_tied.sympy(H, params["wte"])
    return unembed_untied.sympy(H, params["w_u"], params.get("b_u"))
