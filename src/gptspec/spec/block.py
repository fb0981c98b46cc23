"""Spec entries: block — LayerNorm, activations, the FFN variants and the residual blocks.

A block's parameters ``p`` are the canonical schema's ``blocks.{l}.*`` arrays with the
prefix dropped (``ln_1.weight``, ``attn.w_qkv``, ``ffn.w_1``, ...); biases are (1, n) rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import sympy as sp

from gptspec.spec.attention import linear, multi_head_attention
from gptspec.spec.config import GPTConfig
from gptspec.spec.embedding import ROW_VECTORS
from gptspec.spec.equation import Decision, Equation, Reading, Symbol, Tolerance, equation
from gptspec.spec.sources import (
    BA_2016,
    BLUEPRINT,
    BROWN_2020,
    GUIDE,
    HENDRYCKS_2016,
    NOTES,
    RADFORD_2019,
    VASWANI_2017,
    Source,
)

DEFAULT_EPS = sp.Rational(1, 10**5)  # GPT-2's, and GPTConfig.ln_eps's default

LAYER_NORM_FORM = Decision(
    question=r"Which variance, and where does $\varepsilon$ go?",
    readings=(
        Reading(Source(BA_2016, "sec. 3"),
                r"$\mu = \frac{1}{H}\sum_i a_i$, $\sigma = \sqrt{\frac{1}{H}\sum_i (a_i - \mu)^2}$"
                r" (biased, divide by H), then gain and bias; no $\varepsilon$ written"),
        Reading(Source(RADFORD_2019, "sec. 2.3 (released code)"),
                r"$(x - \mu)/\sqrt{\sigma^2 + \varepsilon}$ with $\varepsilon = 10^{-5}$, biased "
                r"variance"),
        Reading(Source(BLUEPRINT, "eqs 7–8"), "LayerNorm, not defined further"),
        Reading(Source(GUIDE, "sec. 5"), "LayerNorm, not defined further"),
    ),
    decision=r"Biased variance (divide by $d_{\mathrm{model}}$) and $\varepsilon$ inside the root: "
             r"$\gamma \odot (x - \mu)/\sqrt{\sigma^2 + \varepsilon} + \beta$, "
             r"$\varepsilon$ = config.ln_eps (default $10^{-5}$).",
    why="Ba et al.'s definition with GPT-2's ε placement: GPT-2's checkpoints were trained "
        "with exactly this, and it is torch.nn.LayerNorm's definition. ε inside the root "
        "keeps a constant row finite (output β).",
)


@equation(
    id="layer_norm",
    title="Layer normalisation",
    group="block",
    latex=r"\operatorname{LN}(x) = \gamma \odot \frac{x - \mu}{\sqrt{\sigma^2 + \varepsilon}} + \beta,"
          r"\quad \mu = \frac{1}{d}\sum_{i=1}^{d} x_i,\quad "
          r"\sigma^2 = \frac{1}{d}\sum_{i=1}^{d} (x_i - \mu)^2",
    symbols=(
        Symbol("x", "(T, d_model)", "rows to normalise, each on its own"),
        Symbol(r"\gamma", "(d_model,)", "gain (ln.weight)"),
        Symbol(r"\beta", "(d_model,)", "bias (ln.bias)"),
        Symbol(r"\varepsilon", "()", "config.ln_eps > 0"),
        Symbol(r"\operatorname{LN}(x)", "(T, d_model)", "normalised rows"),
        Symbol(r"\mu", "(T,)", "each row's mean"),
        Symbol(r"\sigma^2", "(T,)", "each row's (biased) variance"),
    ),
    sources=(Source(BA_2016, "sec. 3"), Source(BLUEPRINT, "eqs 7–8"),
             Source(GUIDE, "sec. 5"), Source(NOTES, "sec. 4.1"),
             Source(RADFORD_2019, "sec. 2.3")),
    reference="layer_norm",
    tolerance=Tolerance(r"\lambda\left(|\gamma|\,\delta\hat x \oplus u\,(|\gamma\,\hat x| + "
                        r"|\beta|) \oplus u\,|y|\right),\quad \delta\hat x = \frac{u\,|x - \mu| "
                        r"\oplus s_n\,\overline{|x|}}{\rho} \oplus |\hat x|\left(\frac{(s_n + "
                        r"2u)\,\sigma^2}{2\rho^2} \oplus 2u\right) \oplus u\,|\hat x|,\quad \rho "
                        r"= \sqrt{\sigma^2 + \varepsilon}",
                        reduction="d_model",
                        note="for an exact input (the check's): μ and σ² are sums of n = d_model terms "
                             "of one sign, each rounding with scale s_n = max(√n, (n − 1)/λ)·u, since a "
                             "sequential sum of nearly equal terms rounds the same way at every step; x "
                             "− μ, ε's addition, the root and the division round once each, and σ²'s "
                             "relative error halves through the root; γ scales x̂'s error, the product "
                             "and the sum round, and storing y rounds once (budgets.layer_norm_bound, "
                             "which also carries an input's error through to first order); its check: "
                             "λ·(δx̂ from the roundings of μ and σ², s(n)·u each with s(n) = max(√n, (n "
                             "− 1)/λ), and of the root) (budgets.layer_norm_bound)"),
    decisions=(LAYER_NORM_FORM,),
    sympy_inputs=(("x", "(T, d_model)"), ("gamma", "(1, d_model)"), ("beta", "(1, d_model)"),
                  ("eps", "() > 0")),
)
def layer_norm(x: sp.Matrix, gamma: sp.Matrix, beta: sp.Matrix,
               eps: sp.Expr = DEFAULT_EPS) -> sp.Matrix:
    d = x.cols
    rows = []
    for t in range(x.rows):
        x_t = x.row(t)
        mu = sum(x_t) / d
        var = sum((x_ti - mu) ** 2 for x_ti in x_t) / d
        rows.append(gamma.multiply_elementwise((x_t - mu * sp.ones(1, d)) / sp.sqrt(var + eps))
                    + beta)
    return sp.Matrix.vstack(*rows)


def gelu_tanh_gap() -> tuple[float, float]:
    """(max |GELU_tanh(x) − GELU(x)|, the x where it is reached), in float64: a scan in
    steps of 1e-3 over [−8, 8] (beyond it both are 0 or x to double precision), then a
    golden-section search around the largest sample."""
    def gap(x: float) -> float:
        exact = 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))
        tanh = 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
        return abs(tanh - exact)

    best = max((i / 1000.0 for i in range(-8000, 8001)), key=gap)
    lo, hi = best - 1e-3, best + 1e-3
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(60):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        lo, hi = (a, hi) if gap(a) < gap(b) else (lo, b)
    x = (lo + hi) / 2.0
    return gap(x), x


_GELU_GAP, _GELU_GAP_AT = gelu_tanh_gap()

ACTIVATION = Decision(
    question="Which non-linearity in the feed-forward network?",
    readings=(
        Reading(Source(BLUEPRINT, "eq 6"), r"ReLU: $\max(0, x W_1 + b_1)$"),
        Reading(Source(VASWANI_2017, "sec. 3.3, eq 2"), "ReLU"),
        Reading(Source(GUIDE, "sec. 4"), r"'$\sigma$ ... such as ReLU or GELU'"),
        Reading(Source(HENDRYCKS_2016, "sec. 2"),
                r"GELU $x\,\Phi(x)$, approximated by "
                r"$\frac{1}{2}x(1 + \tanh[\sqrt{2/\pi}(x + 0.044715 x^3)])$"),
        Reading(Source(RADFORD_2019, "sec. 2.3 (released code)"), "the tanh approximation"),
        Reading(Source(BROWN_2020, "sec. 2.1"), "as GPT-2"),
    ),
    decision="Three activations, chosen by config.ffn: relu (Blueprint), gelu (exact xΦ(x)) "
             "and gelu_tanh (GPT-2/3, the default of the GPT-2 presets).",
    why="GPT-2's checkpoints were trained with the tanh approximation; it differs from the "
        f"exact GELU by up to {_GELU_GAP:.2g} (absolute, at x ≈ {_GELU_GAP_AT:.2f}; computed "
        "when the spec is loaded), far above any float32 budget, so the two are separate "
        "entries rather than one with a loose tolerance.",
)


@equation(
    id="relu",
    title="ReLU",
    group="block",
    latex=r"\operatorname{ReLU}(x) = \max(0, x)",
    symbols=(Symbol("x", "(m, n)", "any array, elementwise"),),
    sources=(Source(BLUEPRINT, "eq 6"), Source(VASWANI_2017, "sec. 3.3, eq 2"),
             Source(GUIDE, "sec. 4")),
    reference="relu",
    tolerance=Tolerance(r"\lambda\,u\,|y|",
                        reduction="1",
                        note="ReLU does no arithmetic (0 roundings of its own): only storing y rounds; "
                             "an input's error would pass through the slope, 1 within λ times that error "
                             "of the kink (budgets.activation_bound); its check: λ·0·u(|x| + |y|) (its "
                             "evaluation's roundings) ⊕ u|y|"),
    decisions=(ACTIVATION,),
    sympy_inputs=(("x", "(m, n)"),),
)
def relu(x: sp.Matrix) -> sp.Matrix:
    return x.applyfunc(lambda v: sp.Max(0, v))


@equation(
    id="gelu",
    title="GELU (exact)",
    group="block",
    latex=r"\operatorname{GELU}(x) = x\,\Phi(x) = \frac{x}{2}\left(1 + "
          r"\operatorname{erf}\!\left(\frac{x}{\sqrt{2}}\right)\right)",
    symbols=(Symbol("x", "(m, n)", "any array, elementwise"),
             Symbol(r"\Phi", "()", "the standard normal distribution function, elementwise")),
    sources=(Source(HENDRYCKS_2016, "sec. 2"), Source(GUIDE, "sec. 4")),
    reference="gelu",
    tolerance=Tolerance(r"\lambda\left(6\,u\,(|x| + |y|) \oplus u\,|y|\right)",
                        reduction="1",
                        note="its evaluation rounds 6 times (x/√2, erf, 1 +, ·x, ·½ and the result), "
                             "each relative to at most |x| + |y|, and storing y once more; an input's "
                             "error would pass through the slope |Φ(x) + xφ(x)| "
                             "(budgets.activation_bound); its check: λ·6·u(|x| + |y|) (its evaluation's "
                             "roundings) ⊕ u|y|"),
    decisions=(ACTIVATION,),
    sympy_inputs=(("x", "(m, n)"),),
)
def gelu(x: sp.Matrix) -> sp.Matrix:
    return x.applyfunc(lambda v: v / 2 * (1 + sp.erf(v / sp.sqrt(2))))


@equation(
    id="gelu_tanh",
    title="GELU (tanh approximation)",
    group="block",
    latex=r"\operatorname{GELU}_{\tanh}(x) = \frac{x}{2}\left(1 + \tanh\!\left(\sqrt{2/\pi}\,"
          r"\left(x + 0.044715\,x^3\right)\right)\right)",
    symbols=(Symbol("x", "(m, n)", "any array, elementwise"),),
    sources=(Source(HENDRYCKS_2016, "sec. 2"), Source(RADFORD_2019, "sec. 2.3"),
             Source(BROWN_2020, "sec. 2.1")),
    reference="gelu_tanh",
    tolerance=Tolerance(r"\lambda\left(10\,u\,(|x| + |y|) \oplus u\,|y|\right)",
                        reduction="1",
                        note="its evaluation rounds 10 times (x³, ·c, +x, ·√(2/π), tanh, 1 +, ·x, ·½), "
                             "each relative to at most |x| + |y|, and storing y once more; an input's "
                             "error would pass through the slope (budgets.activation_bound); its check: "
                             "λ·10·u(|x| + |y|) (its evaluation's roundings) ⊕ u|y|"),
    decisions=(ACTIVATION,),
    sympy_inputs=(("x", "(m, n)"),),
)
def gelu_tanh(x: sp.Matrix) -> sp.Matrix:
    c = sp.Rational(44715, 10**6)
    return x.applyfunc(lambda v: v / 2 * (1 + sp.tanh(sp.sqrt(2 / sp.pi) * (v + c * v**3))))


_FFN_SYMBOLS = (
    Symbol("x", "(T, d_model)", "input rows, each processed on its own"),
    Symbol("W_1", "(d_model, d_ff)", "ffn.w_1"),
    Symbol("b_1", "(d_ff,)", "ffn.b_1"),
    Symbol("W_2", "(d_ff, d_model)", "ffn.w_2"),
    Symbol("b_2", "(d_model,)", "ffn.b_2"),
)
_FFN_INPUTS = (("x", "(T, d_model)"), ("W_1", "(d_model, d_ff)"), ("b_1", "(1, d_ff)"),
               ("W_2", "(d_ff, d_model)"), ("b_2", "(1, d_model)"))
_FFN_TOLERANCE = Tolerance(r"\lambda\left(\sqrt{d_{\mathrm{ff}}}\,u\,(|g|\,|W_2| + |b_2|) \oplus "
                           r"\sqrt{\varepsilon_g^2\,W_2^2} \oplus u\,|y|\right),\quad \varepsilon_g "
                           r"= |\sigma'(a)|\,\varepsilon_a \oplus R_\sigma\,u\,(|a| + |g|) \oplus "
                           r"u\,|g|,\quad \varepsilon_a = \sqrt{d_{\mathrm{model}}}\,u\,(|x|\,|W_1| "
                           r"+ |b_1|) \oplus u\,|a|",
                           reduction="d_ff",
                           note="a = x W_1 + b_1 and g = σ(a): linear's budget for the first product, "
                                "carried through σ by its slope (widened by the curvature, and by ReLU's "
                                "kink) beside σ's own R_σ roundings (0 for ReLU, 6 for GELU, 10 for its "
                                "tanh form), then through W_2 (squares entry by entry) beside the second "
                                "product's own √d_ff·u (budgets.ffn_bound); each inner length counts the "
                                "bias (+1); its check: W_1 → activation → W_2 (or the product), "
                                "propagated (budgets.ffn_bound)")


def _ffn(x: sp.Matrix, W_1: sp.Matrix, b_1: sp.Matrix | None, W_2: sp.Matrix,
         b_2: sp.Matrix | None, sigma: Callable[[sp.Matrix], sp.Matrix]) -> sp.Matrix:
    return linear.sympy(sigma(linear.sympy(x, W_1, b_1)), W_2, b_2)


@equation(
    id="ffn_relu",
    title="Feed-forward network (ReLU)",
    group="block",
    latex=r"\operatorname{FFN}(x) = \max(0,\, x W_1 + b_1)\, W_2 + b_2",
    symbols=_FFN_SYMBOLS,
    sources=(Source(BLUEPRINT, "eq 6"), Source(VASWANI_2017, "sec. 3.3, eq 2")),
    reference="ffn_relu",
    tolerance=_FFN_TOLERANCE,
    decisions=(ACTIVATION, ROW_VECTORS),
    sympy_inputs=_FFN_INPUTS,
)
def ffn_relu(x: sp.Matrix, W_1: sp.Matrix, b_1: sp.Matrix | None, W_2: sp.Matrix,
             b_2: sp.Matrix | None) -> sp.Matrix:
    return _ffn(x, W_1, b_1, W_2, b_2, relu.sympy)


@equation(
    id="ffn_gelu",
    title="Feed-forward network (exact GELU)",
    group="block",
    latex=r"\operatorname{FFN}(x) = \operatorname{GELU}(x W_1 + b_1)\, W_2 + b_2",
    symbols=_FFN_SYMBOLS,
    sources=(Source(HENDRYCKS_2016, "sec. 2"), Source(GUIDE, "sec. 4"),
             Source(VASWANI_2017, "sec. 3.3")),
    reference="ffn_gelu",
    tolerance=_FFN_TOLERANCE,
    decisions=(ACTIVATION,),
    sympy_inputs=_FFN_INPUTS,
)
def ffn_gelu(x: sp.Matrix, W_1: sp.Matrix, b_1: sp.Matrix | None, W_2: sp.Matrix,
             b_2: sp.Matrix | None) -> sp.Matrix:
    return _ffn(x, W_1, b_1, W_2, b_2, gelu.sympy)


@equation(
    id="ffn_gelu_tanh",
    title="Feed-forward network (tanh GELU, GPT-2/3)",
    group="block",
    latex=r"\operatorname{FFN}(x) = \operatorname{GELU}_{\tanh}(x W_1 + b_1)\, W_2 + b_2",
    symbols=_FFN_SYMBOLS,
    sources=(Source(RADFORD_2019, "sec. 2.3"), Source(BROWN_2020, "sec. 2.1"),
             Source(NOTES, "sec. 4.1 (MLP layers)"), Source(HENDRYCKS_2016, "sec. 2")),
    reference="ffn_gelu_tanh",
    tolerance=_FFN_TOLERANCE,
    decisions=(ACTIVATION,),
    sympy_inputs=_FFN_INPUTS,
)
def ffn_gelu_tanh(x: sp.Matrix, W_1: sp.Matrix, b_1: sp.Matrix | None, W_2: sp.Matrix,
                  b_2: sp.Matrix | None) -> sp.Matrix:
    return _ffn(x, W_1, b_1, W_2, b_2, gelu_tanh.sympy)


@equation(
    id="ffn_guide_product",
    title="The Guide's product feed-forward network",
    group="block",
    latex=r"\operatorname{FFNN}(x) = \operatorname{ReLU}(x W_1 + b_1) \odot "
          r"\operatorname{ReLU}(x W_2 + b_2)",
    symbols=(
        Symbol("x", "(T, d_model)", "input rows"),
        Symbol("W_1", "(d_model, d_model)", "ffn.w_1 (d_ff = d_model)"),
        Symbol("b_1", "(d_model,)", "ffn.b_1"),
        Symbol("W_2", "(d_model, d_model)", "ffn.w_2: it also reads x"),
        Symbol("b_2", "(d_model,)", "ffn.b_2"),
    ),
    sources=(Source(GUIDE, "sec. 4"),),
    reference="ffn_guide_product",
    tolerance=Tolerance(r"\lambda\left(\varepsilon_{a_1} \odot |a_2| \oplus |a_1| \odot "
                        r"\varepsilon_{a_2} \oplus \varepsilon_{a_1} \odot \varepsilon_{a_2} "
                        r"\oplus u\,|a_1 \odot a_2|\right),\quad \varepsilon_{a_k} = "
                        r"|\sigma'(z_k)|\,\varepsilon_{z_k} \oplus u\,|a_k|,\quad "
                        r"\varepsilon_{z_k} = \sqrt{d_{\mathrm{model}}}\,u\,(|x|\,|W_k| + |b_k|) "
                        r"\oplus u\,|z_k|",
                        reduction="d_model",
                        note="z_k = x W_k + b_k and a_k = ReLU(z_k): each linear map's budget carried "
                             "through ReLU (slope 0 or 1, and 1 near the kink), then each factor's error "
                             "scaled by the other, with their product and the stored result "
                             "(budgets.ffn_bound); its check: W_1 → activation → W_2 (or the product), "
                             "propagated (budgets.ffn_bound)"),
    decisions=(
        Decision(
            question=r"What is $\sigma(W_1 x + b_1) \times \sigma(W_2 x + b_2)$?",
            readings=(
                Reading(Source(GUIDE, "sec. 4"),
                        r"$\operatorname{FFNN}(x) = \sigma(W_1 x + b_1) \times \sigma(W_2 x + "
                        r"b_2)$,"
                        r" $\sigma$ 'such as ReLU or GELU'; shapes not given"),
                Reading(Source(BLUEPRINT, "eq 6"),
                        r"a composition $\max(0, x W_1 + b_1) W_2 + b_2$, not a product"),
                Reading(Source(VASWANI_2017, "sec. 3.3, eq 2"), "a composition, as the Blueprint"),
            ),
            decision=r"Kept as its own variant (config.ffn = 'guide_product') and read literally: "
                     r"both maps read $x$, $\times$ is the elementwise product, $\sigma$ = ReLU, "
                     r"and $W_1, W_2$ are $d_{\mathrm{model}} \times d_{\mathrm{model}}$ "
                     r"(the configuration refuses d_ff ≠ d_model).",
            why="A matrix product of two vectors is undefined and an outer product would not "
                "return to the residual stream, so the only shape-consistent literal reading is "
                "elementwise, and its output is added to H, so it must have d_model entries. "
                "ReLU is the first activation the Guide names. The Blueprint's composition is "
                "the ffn_relu variant.",
        ),
        ROW_VECTORS,
    ),
    sympy_inputs=(("x", "(T, d_model)"), ("W_1", "(d_model, d_model)"), ("b_1", "(1, d_model)"),
                  ("W_2", "(d_model, d_model)"), ("b_2", "(1, d_model)")),
)
def ffn_guide_product(x: sp.Matrix, W_1: sp.Matrix, b_1: sp.Matrix | None, W_2: sp.Matrix,
                      b_2: sp.Matrix | None) -> sp.Matrix:
    return relu.sympy(linear.sympy(x, W_1, b_1)).multiply_elementwise(
        relu.sympy(linear.sympy(x, W_2, b_2)))


FFN: dict[str, Equation] = {"relu": ffn_relu, "gelu": ffn_gelu, "gelu_tanh": ffn_gelu_tanh,
                            "guide_product": ffn_guide_product}

NORM_PLACEMENT = Decision(
    question="Where do the residual connections and LayerNorms go in a block?",
    readings=(
        Reading(Source(BLUEPRINT, "eqs 7–8"),
                r"post-LN: $H' = \operatorname{LN}(H + \operatorname{MultiHead}(H))$, "
                r"$H_{\mathrm{out}} = \operatorname{LN}(H' + \operatorname{FFN}(H'))$"),
        Reading(Source(VASWANI_2017, "sec. 3.1"),
                r"post-LN: $\operatorname{LN}(x + \operatorname{Sublayer}(x))$"),
        Reading(Source(RADFORD_2019, "sec. 2.3"),
                "pre-LN: LayerNorm moved to the input of each sub-block, and one more after "
                "the last block"),
        Reading(Source(BROWN_2020, "sec. 2.1"), "as GPT-2 (pre-LN)"),
        Reading(Source(NOTES, "sec. 4.1"),
                "residual blocks that add each sub-layer's output to the residual stream"),
        Reading(Source(GUIDE, "sec. 5"),
                r"one residual and one LayerNorm: "
                r"$H^{(l+1)} = "
                r"\operatorname{LN}(\operatorname{FFNN}(\operatorname{Attention}(H^{(l)}))"
                r" + H^{(l)})$"),
    ),
    decision="All three are kept, chosen by config.norm: 'pre' (GPT-2/3, the default and the "
             "GPT-2 presets), 'post' (Blueprint eqs 7–8, the blueprint preset), 'guide' (the "
             "Guide's single-residual form, the guide preset, with one LayerNorm ln_1).",
    why="They are different functions, not notations of one: pre-LN is what GPT-2's weights "
        "need, post-LN is what the Blueprint specifies, and the Guide's form has no residual "
        "around attention. Keeping each as an entry lets every document's model be run and "
        "checked.",
)


def _attention(H: sp.Matrix, p: dict[str, sp.Matrix], config: GPTConfig) -> sp.Matrix:
    return multi_head_attention.sympy(H, p["attn.w_qkv"], p.get("attn.b_qkv"), p["attn.w_o"],
                                      p.get("attn.b_o"), config.n_heads)


def _ln(H: sp.Matrix, p: dict[str, sp.Matrix], which: str, config: GPTConfig) -> sp.Matrix:
    return layer_norm.sympy(H, p[f"{which}.weight"], p[f"{which}.bias"],
                            sp.Rational(config.ln_eps))  # the float64 value, exactly


def _feed_forward(H: sp.Matrix, p: dict[str, sp.Matrix], config: GPTConfig) -> sp.Matrix:
    return FFN[config.ffn].sympy(H, p["ffn.w_1"], p.get("ffn.b_1"), p["ffn.w_2"],
                                 p.get("ffn.b_2"))


_BLOCK_SYMBOLS = (
    Symbol("H", "(T, d_model)", "the residual stream entering the block"),
    Symbol("H'", "(T, d_model)", "the stream between the two sub-layers (the parameters, "
           "blocks.{l}.* of the schema, are the sympy form's p)"),
    Symbol(r"H_{\mathrm{out}}", "(T, d_model)", "the residual stream leaving the block"),
)
_BLOCK_INPUTS = (("H", "(T, d_model)"), ("p", "block params"), ("config", "config"))
_BLOCK_TOLERANCE = Tolerance(r"\lambda\,\varepsilon_{H_{\mathrm{out}}},\quad "
                             r"\varepsilon_{H_{\mathrm{out}}} = \varepsilon_{H'} \oplus "
                             r"\varepsilon_{\mathrm{FFN}} \oplus u\,|H_{\mathrm{out}}|, \quad "
                             r"\varepsilon_{H'} = \varepsilon_H \oplus "
                             r"\varepsilon_{\mathrm{MultiHead}} \oplus u\,|H'|",
                             reduction="d_ff",
                             note="as written for pre-LN: each residual sum adds its operands' error "
                                  "scales in quadrature and rounds once; ε_MultiHead and ε_FFN are those "
                                  "sub-layers' error scales given their inputs' (a LayerNorm's output "
                                  "error from layer_norm's budget), so an error entering a sub-layer is "
                                  "carried through its weights rather than bounded by a Jacobian's norm; "
                                  "post-LN and the Guide pass each sum through LayerNorm's budget "
                                  "instead (budgets.block_bound); its check: LayerNorm, attention and "
                                  "FFN budgets propagated through the block")


@equation(
    id="block_pre_ln",
    title="Residual block, pre-LN (GPT-2/3)",
    group="block",
    latex=r"H' = H + \operatorname{MultiHead}(\operatorname{LN}_1(H)), \qquad "
          r"H_{\mathrm{out}} = H' + \operatorname{FFN}(\operatorname{LN}_2(H'))",
    symbols=_BLOCK_SYMBOLS,
    sources=(Source(RADFORD_2019, "sec. 2.3"), Source(BROWN_2020, "sec. 2.1"),
             Source(NOTES, "sec. 4.1")),
    reference="block_pre_ln",
    tolerance=_BLOCK_TOLERANCE,
    decisions=(NORM_PLACEMENT,),
    sympy_inputs=_BLOCK_INPUTS,
)
def block_pre_ln(H: sp.Matrix, p: dict[str, sp.Matrix], config: GPTConfig) -> sp.Matrix:
    H1 = H + _attention(_ln(H, p, "ln_1", config), p, config)
    return H1 + _feed_forward(_ln(H1, p, "ln_2", config), p, config)


@equation(
    id="block_post_ln",
    title="Residual block, post-LN (Blueprint)",
    group="block",
    latex=r"H' = \operatorname{LN}_1(H + \operatorname{MultiHead}(H)), \qquad "
          r"H_{\mathrm{out}} = \operatorname{LN}_2(H' + \operatorname{FFN}(H'))",
    symbols=_BLOCK_SYMBOLS,
    sources=(Source(BLUEPRINT, "eqs 7–8"), Source(VASWANI_2017, "sec. 3.1")),
    reference="block_post_ln",
    tolerance=_BLOCK_TOLERANCE,
    decisions=(NORM_PLACEMENT,),
    sympy_inputs=_BLOCK_INPUTS,
)
def block_post_ln(H: sp.Matrix, p: dict[str, sp.Matrix], config: GPTConfig) -> sp.Matrix:
    H1 = _ln(H + _attention(H, p, config), p, "ln_1", config)
    return _ln(H1 + _feed_forward(H1, p, config), p, "ln_2", config)


@equation(
    id="block_guide",
    title="The Guide's single-residual block",
    group="block",
    latex=r"H^{(l+1)} = \operatorname{LN}\!\left(\operatorname{FFNN}"
          r"(\operatorname{MultiHead}(H^{(l)})) + H^{(l)}\right)",
    symbols=(Symbol("H^{(l)}", "(T, d_model)", "the residual stream entering block l"),
             Symbol("H^{(l+1)}", "(T, d_model)", "the residual stream leaving it")),
    sources=(Source(GUIDE, "sec. 5"),),
    reference="block_guide",
    tolerance=_BLOCK_TOLERANCE,
    decisions=(
        NORM_PLACEMENT,
        Decision(
            question="What is the Guide's Attention(H) inside a block?",
            readings=(
                Reading(Source(GUIDE, "sec. 3, sec. 5"),
                        r"$\operatorname{Attention}(Q, K, V)$ of one head, applied to $H$ without "
                        r"saying how $Q, K, V$ are formed"),
                Reading(Source(BLUEPRINT, "eqs 2–5"), "masked multi-head attention with W_O"),
            ),
            decision="Masked multi-head attention with the same parameters as every other "
                     "block (attn.w_qkv, attn.b_qkv, attn.w_o, attn.b_o); the single "
                     "LayerNorm is ln_1.",
            why="The Guide names self-attention with Q, K, V and a causal-LM objective; the "
                "shared parameter schema keeps its model comparable with the others.",
        ),
    ),
    sympy_inputs=_BLOCK_INPUTS,
)
def block_guide(H: sp.Matrix, p: dict[str, sp.Matrix], config: GPTConfig) -> sp.Matrix:
    return _ln(_feed_forward(_attention(H, p, config), p, config) + H, p, "ln_1", config)


BLOCK: dict[str, Equation] = {"pre": block_pre_ln, "post": block_post_ln, "guide": block_guide}
