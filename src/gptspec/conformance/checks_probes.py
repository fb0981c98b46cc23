"""Probes: every forward-area entry judged through ``forward`` alone, for engines that
expose nothing but logits.

A probe builds a model whose logits depend on few entries, the others made zero or the
identity (W_O = 0 silences attention, W_2 = 0 the FFN, a post-LN block with both silenced
is LayerNorm alone), and compares the whole model with the reference within the whole
model's budget (budgets.gpt_forward_bound). Each probe names the entry it isolates and
declares its *support*: every entry its logits depend on. :func:`localise` turns the
probes that failed and passed into the entries they point at.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from gptspec import reference as ref
from gptspec.conformance import budgets as B
from gptspec.conformance.expressible import fit_to_backend
from gptspec.conformance.registry import check
from gptspec.conformance.strategies import (
    BOUNDARY_LENGTHS,
    DEFAULT_SCALES,
    HEAD_WIDTHS,
    PARAMETER_SCALES,
    ParameterRecipe,
    big,
    token_arrays,
)
from gptspec.spec.config import GPTConfig

Params = dict[str, np.ndarray]
Case = tuple[GPTConfig, Params, np.ndarray]

TOKEN = frozenset({"token_embedding", "one_hot", "token_embedding_one_hot"})
POSITION = frozenset({"positional_embedding", "input_representation"})
READ_OUT = frozenset({"unembed_untied", "linear", "gpt_forward"})
PRE_LN = frozenset({"block_pre_ln"})
ATTENTION = frozenset({"causal_mask", "softmax", "softmax_shifted", "attention_weights",
                       "attention_scores", "scaled_dot_product_attention", "qkv_projection",
                       "split_heads", "merge_heads", "multi_head_attention",
                       "multi_head_attention_head_sum", "linear"})
FFN_ENTRIES = {"relu": {"relu", "ffn_relu"}, "gelu": {"gelu", "ffn_gelu"},
               "gelu_tanh": {"gelu_tanh", "ffn_gelu_tanh"},
               "guide_product": {"relu", "ffn_guide_product"}}
MODEL_BUDGET = "the whole model's: every stage's roundings propagated (budgets.gpt_forward_bound)"
# vocabularies past 2¹⁶ (ids that wrap in 16 bits) and a real tokenizer's; small d keeps
# the reference cheap
BIG_VOCABS = (1025, 65537, 100277)


@dataclass(frozen=True)
class Probe:
    entry: str  # the entry the probe isolates; its check is probe.<name>
    entries: tuple[str, ...]  # what the check names (the entry and its equal forms)
    support: frozenset[str]  # every entry the probe's logits depend on
    build: Callable[[st.DataObject, str], Case] | None  # None: evidence from a property
    doc: str
    name: str = ""  # the check's name when it differs from the entry's
    # the entries the logits depend on only through a NaN or ∞, which a non-finite
    # output points at too: those of the sublayers the probe silences by zero weights
    # (zero times NaN is NaN), and the mask where the construction holds for any mask
    # that leaves each row a key (a row with none is NaN: the spec's softmax needs one
    # finite entry). Other entries make NaN of finite numbers only by overflowing, which
    # the probes built to overflow (softmax's, attention_scores') hold in their support.
    nonfinite: frozenset[str] = frozenset()


PROBES: dict[str, Probe] = {}


# --- building blocks ---------------------------------------------------------------------


def _config(data: st.DataObject, *, wide: bool = False, **fixed) -> GPTConfig:
    """A small configuration (a real head width or a long context when ``wide``), one
    block, every option off unless ``fixed`` turns it on."""
    n_heads = fixed.pop("n_heads", None) or data.draw(st.integers(1, 2), label="heads")
    if wide and data.draw(big(1 / 3), label="a real head width"):
        d_k = data.draw(st.sampled_from(HEAD_WIDTHS), label="d_k")
    else:
        d_k = data.draw(st.integers(1, 6), label="d_k")
    d_model = n_heads * d_k
    values: dict[str, Any] = dict(vocab_size=data.draw(st.integers(2, 24), label="V"),
                  n_ctx=data.draw(st.integers(1, 8), label="n_ctx"), d_model=d_model,
                  n_layers=1, n_heads=n_heads, d_ff=data.draw(st.integers(1, 2 * d_model)),
                  norm="pre", ffn="relu", tied_embeddings=False, attn_bias=False,
                  ffn_bias=False, positional_embedding=False, output_bias=False,
                  final_norm=False,
                  ln_eps=data.draw(st.sampled_from((1e-5, 1e-6, 1e-12, 1e-3)), label="ε"))
    values.update(fixed)
    if values["ffn"] == "guide_product":
        values["d_ff"] = values["d_model"]
    return GPTConfig(**values)


def _random(data: st.DataObject, config: GPTConfig, dtype: str) -> Params:
    """Random parameters of every shape, at one of the dtype's weight scales."""
    scale = data.draw(st.sampled_from(PARAMETER_SCALES.get(dtype, DEFAULT_SCALES)), label="scale")
    return ParameterRecipe(config, scale, data.draw(st.integers(0, 2**32 - 1), label="seed")).make()


def _silence(params: Params, attention: bool = False, ffn: bool = False) -> Params:
    """Zero the maps that write a sublayer into the residual stream."""
    for key in (["attn.w_o", "attn.b_o"] if attention else []) + \
               (["ffn.w_2", "ffn.b_2"] if ffn else []):
        name = f"blocks.0.{key}"
        if name in params:
            params[name] = np.zeros_like(params[name])
    return params


def _tokens(data: st.DataObject, config: GPTConfig, long: bool = False) -> np.ndarray:
    T = config.n_ctx if long else None
    return data.draw(token_arrays(config, length=T), label="tokens")


def _long_context(data: st.DataObject) -> int:
    """n_ctx: small, or one of the block-boundary lengths."""
    if data.draw(big(1 / 3), label="a long context"):
        return data.draw(st.sampled_from(BOUNDARY_LENGTHS), label="n_ctx")
    return data.draw(st.integers(1, 8), label="n_ctx")


def _vocab(data: st.DataObject, share: float = 1 / 4) -> int:
    if data.draw(big(share), label="a big vocabulary"):
        return data.draw(st.sampled_from(BIG_VOCABS), label="V")
    return data.draw(st.integers(2, 24), label="V")


def _tiny_variance(data: st.DataObject, W: np.ndarray, eps: float) -> np.ndarray:
    """Rows of ``W`` made into an offset plus a spread near √ε: LayerNorm's hard case,
    where ε and the variance's form decide the result."""
    if not data.draw(st.booleans(), label="tiny variance"):
        return W
    spread = math.sqrt(eps) * data.draw(st.sampled_from((0.1, 1.0, 10.0)), label="spread/√ε")
    centred = W - W.mean(axis=-1, keepdims=True)
    norm = np.sqrt((centred ** 2).mean(axis=-1, keepdims=True)) + 1e-300
    return 1.0 + spread * centred / norm


# A sublayer silenced by a zero W_O (W_2) is silent only where the equation that applies
# W_O (W_2) is computed: those entries are in the probe's support. Its other entries
# matter only if they make a non-finite number (Probe.nonfinite).
SILENCING = {"attention": frozenset({"multi_head_attention", "multi_head_attention_head_sum"}),
             "ffn": frozenset({"ffn_relu"})}
SILENCED = {"attention": ATTENTION, "ffn": frozenset({"relu", "ffn_relu", "linear"})}
BOTH = ("attention", "ffn")


def probe(entry: str, support: set[str] | frozenset[str], entries: tuple[str, ...] = (),
          name: str = "", silences: tuple[str, ...] = (), nonfinite: frozenset[str] = frozenset()
          ) -> Callable[[Callable[[st.DataObject, str], Case]], Callable]:
    """Register ``build`` as the probe of ``entry`` (check probe.<name>, by default
    probe.<entry>); ``silences``: the sublayers ("attention", "ffn") it zeroes;
    ``nonfinite``: other entries the logits depend on only through a NaN or ∞. Its
    docstring states the construction."""
    def register(build: Callable[[st.DataObject, str], Case]) -> Callable:
        names = entries or (entry,)
        full = frozenset(support) | set(names)
        for sublayer in silences:
            full |= SILENCING[sublayer]
        only_nonfinite = frozenset().union(nonfinite, *(SILENCED[s] for s in silences)) - full
        key = name or entry
        PROBES[key] = Probe(entry, names, full, build, (build.__doc__ or "").strip(), key,
                            only_nonfinite)
        _register_check(PROBES[key])
        return build
    return register


def _register_check(p: Probe) -> None:
    build = p.build
    assert build is not None

    def run(backend, ctx):
        @ctx.given(data=st.data())
        def _(data):
            config, params, tokens = build(data, ctx.precision.dtype)
            config, params = fit_to_backend(config, params, backend,
                                  keep_tied="unembed_untied" not in p.support)
            params = {k: B.round_to(v, ctx.precision.dtype) for k, v in params.items()}
            expected = ref.gpt_forward(tokens, params, config)
            scale = B.gpt_forward_bound(tokens, params, config, ctx.precision)
            ctx.record("logits", B.compare(backend.forward(tokens, params, config), expected,
                                           B.budget(scale)))

    run.__doc__ = (f"Through forward alone, isolating {p.entry}: {p.doc} "
                   f"The logits depend on {', '.join(sorted(p.support))} only.")
    check(f"probe.{p.name}", entries=p.entries, budget=MODEL_BUDGET)(run)


# --- embeddings and the read-out -------------------------------------------------------------


@probe("token_embedding", TOKEN | PRE_LN | READ_OUT,
       entries=("token_embedding", "one_hot", "token_embedding_one_hot"), silences=BOTH)
def _token_embedding(data, dtype):
    """no positional embedding, a silenced pre-LN block and an untied read-out without
    bias, so the logits are W_E[x] W_U; vocabularies up to 100277 (ids past 2¹⁶)."""
    # half the examples big: this probe is where ids past 2¹⁶ meet the embedding, and at
    # the quick profile a quarter left one run in nine without a vocabulary past 65536
    config = _config(data, vocab_size=_vocab(data, share=1 / 2))
    params = _silence(_random(data, config, dtype), attention=True, ffn=True)
    return config, params, _tokens(data, config)


@probe("positional_embedding", POSITION | PRE_LN | READ_OUT, silences=BOTH)
def _positional_embedding(data, dtype):
    """W_E = 0 and a silenced block, so the logits are W_P[t] W_U; contexts up to 1025
    at every block boundary, the whole context filled."""
    config = _config(data, n_ctx=_long_context(data), positional_embedding=True)
    params = _silence(_random(data, config, dtype), attention=True, ffn=True)
    params["wte"] = np.zeros_like(params["wte"])
    return config, params, _tokens(data, config, long=True)


@probe("input_representation", TOKEN | POSITION | PRE_LN | READ_OUT, silences=BOTH)
def _input_representation(data, dtype):
    """W_E and W_P both random and a silenced block: the logits are (W_E[x] + W_P[t]) W_U."""
    config = _config(data, positional_embedding=True)
    params = _silence(_random(data, config, dtype), attention=True, ffn=True)
    return config, params, _tokens(data, config)


@probe("unembed_tied", TOKEN | PRE_LN | {"unembed_tied", "gpt_forward"}, silences=BOTH)
def _unembed_tied(data, dtype):
    """tied embeddings and a silenced block: the logits are W_E[x] W_Eᵀ."""
    config = _config(data, vocab_size=_vocab(data), tied_embeddings=True)
    params = _silence(_random(data, config, dtype), attention=True, ffn=True)
    return config, params, _tokens(data, config)


@probe("unembed_untied", TOKEN | PRE_LN | READ_OUT, silences=BOTH)
def _unembed_untied(data, dtype):
    """an untied read-out with its bias b_U and a silenced block: W_E[x] W_U + b_U."""
    config = _config(data, output_bias=True)
    params = _silence(_random(data, config, dtype), attention=True, ffn=True)
    return config, params, _tokens(data, config)


@probe("final_layer_norm", TOKEN | PRE_LN | READ_OUT | {"final_layer_norm", "layer_norm"}, silences=BOTH)
def _final_layer_norm(data, dtype):
    """a silenced block and the final LayerNorm, ε drawn from 1e-12 to 1e-3, half the time
    on embeddings of tiny spread around an offset: LN_f(W_E[x]) W_U."""
    config = _config(data, final_norm=True)
    params = _silence(_random(data, config, dtype), attention=True, ffn=True)
    params["wte"] = _tiny_variance(data, params["wte"], config.ln_eps)
    return config, params, _tokens(data, config)


# --- LayerNorm and the feed-forward networks --------------------------------------------------


@probe("layer_norm", TOKEN | READ_OUT | {"layer_norm", "block_post_ln"}, silences=BOTH)
def _layer_norm(data, dtype):
    """a post-LN block with both sublayers silenced is LN_2(LN_1(W_E[x])); ε drawn from
    1e-12 to 1e-3, half the time on embeddings of tiny spread around an offset."""
    config = _config(data, norm="post")
    params = _silence(_random(data, config, dtype), attention=True, ffn=True)
    params["wte"] = _tiny_variance(data, params["wte"], config.ln_eps)
    return config, params, _tokens(data, config)


def _ffn_probe(variant: str, biases: bool):
    entries = FFN_ENTRIES[variant]
    activation = "relu" if variant == "guide_product" else variant
    name = f"ffn_{variant}" if biases else activation

    def build(data, dtype):
        config = _config(data, ffn=variant, ffn_bias=biases)
        params = _silence(_random(data, config, dtype), attention=True)
        return config, params, _tokens(data, config)

    build.__doc__ = (f"attention silenced, so a pre-LN block is H + FFN(LN_2(H)) with the "
                     f"{variant} FFN, {'with' if biases else 'without'} its biases.")
    equal = ("ffn_guide_product",) if variant == "guide_product" else (name,)
    probe(name, TOKEN | PRE_LN | READ_OUT | {"layer_norm"} | entries, entries=equal,
          silences=("attention",))(build)


for _variant in ("relu", "gelu", "gelu_tanh"):
    _ffn_probe(_variant, biases=False)
    _ffn_probe(_variant, biases=True)
_ffn_probe("guide_product", biases=True)


# --- attention ------------------------------------------------------------------------------


ATTENTION_SUPPORT = TOKEN | PRE_LN | READ_OUT | {"layer_norm"} | ATTENTION


def _attention_case(data, dtype, *, zero_scores: bool = False, score_scale: float = 1.0,
                    wide: bool = False, **fixed) -> Case:
    config = _config(data, wide=wide, n_ctx=fixed.pop("n_ctx", None) or _long_context(data),
                     **fixed)
    params = _silence(_random(data, config, dtype), ffn=True)
    w_qkv = params["blocks.0.attn.w_qkv"]
    width = config.d_attn  # h·d_k: the columns of W_Q, then of W_K
    if zero_scores:  # W_Q = W_K = 0: every score 0, each row averages its visible values
        w_qkv[:, : 2 * width] = 0.0
        if "blocks.0.attn.b_qkv" in params:
            params["blocks.0.attn.b_qkv"][: 2 * width] = 0.0
    else:
        w_qkv[:, : 2 * width] *= score_scale
    return config, params, _tokens(data, config, long=True)


# one head: splitting into heads and merging them back are then the identity
ONE_HEAD = ATTENTION_SUPPORT - {"split_heads", "merge_heads"}


@probe("causal_mask", ONE_HEAD - {"attention_scores"},
       entries=("causal_mask", "attention_weights"), silences=("ffn",))
def _causal_mask(data, dtype):
    """one head, W_Q = W_K = 0 and the FFN silenced: every score is 0, so row t of the
    attention averages the values of positions 0 … t, exactly what the mask allows;
    contexts up to 1025, the whole context filled."""
    return _attention_case(data, dtype, zero_scores=True, n_heads=1)


@probe("attention_scores", ONE_HEAD,
       silences=("ffn",))
def _attention_scores(data, dtype):
    """one head of a small or real width (up to 128) and the FFN silenced: the scores
    Q Kᵀ/√d_k, of order one, decide the weights."""
    return _attention_case(data, dtype, n_heads=1, wide=True, n_ctx=8)


@probe("softmax", TOKEN | PRE_LN | READ_OUT | {"layer_norm", "softmax", "softmax_shifted",
                                              "attention_weights", "qkv_projection",
                                              "scaled_dot_product_attention",
                                              "multi_head_attention",
                                              "multi_head_attention_head_sum"},
       entries=("softmax", "softmax_shifted"), silences=("ffn",),
       nonfinite=frozenset({"causal_mask"}))
def _softmax(data, dtype):
    """every value vector the same constant (W_V = 0, b_V = c), so each row of attention
    is c times the sum of its weights, which softmax makes 1 whatever the scores and the
    mask (as long as the mask leaves each row a key: the diagonal); scores grown by W_Q
    and W_K scaled up to where exp overflows without the max shift (past 88 in float32,
    11 in float16); the FFN silenced."""
    scale = data.draw(st.sampled_from((4.0, 16.0, 64.0)), label="score scale")
    config, params, tokens = _attention_case(data, dtype, score_scale=scale, n_ctx=8,
                                             attn_bias=True)
    width = config.d_attn
    params["blocks.0.attn.w_qkv"][:, 2 * width:] = 0.0
    params["blocks.0.attn.b_qkv"][2 * width:] = data.draw(
        st.sampled_from((0.5, 1.25, -3.0)), label="c")
    return config, params, tokens


@probe("scaled_dot_product_attention", ATTENTION_SUPPORT,
       silences=("ffn",))
def _sdpa(data, dtype):
    """two heads, contexts up to 1025, and the FFN silenced: attention as the model
    computes it, at the lengths where fused kernels tile."""
    return _attention_case(data, dtype, n_heads=2)


@probe("split_heads", ATTENTION_SUPPORT, entries=("split_heads", "merge_heads"),
       silences=("ffn",))
def _split_heads(data, dtype):
    """three or four heads with their own weights, and the FFN silenced: a head that sees
    another's columns or positions changes the logits."""
    return _attention_case(data, dtype, n_heads=data.draw(st.integers(3, 4)), n_ctx=8)


@probe("qkv_projection", ATTENTION_SUPPORT,
       silences=("ffn",))
def _qkv_projection(data, dtype):
    """attention with its biases b_Q, b_K, b_V, b_O and the FFN silenced."""
    return _attention_case(data, dtype, attn_bias=True, n_ctx=8)


@probe("multi_head_attention", ATTENTION_SUPPORT, entries=("multi_head_attention",
                                                          "multi_head_attention_head_sum"),
       silences=("ffn",))
def _multi_head_attention(data, dtype):
    """a free head width (h·d_k ≠ d_model) and the FFN silenced: W_O maps the concatenated
    heads back to d_model."""
    config = _config(data, n_ctx=8, attn_bias=data.draw(st.booleans()))
    d_head = data.draw(st.integers(1, 6), label="d_head")
    config = dataclasses.replace(config, d_head=d_head)
    params = _silence(_random(data, config, dtype), ffn=True)
    return config, params, _tokens(data, config)


FLOAT16_MAX = 65504.0


@probe("attention_scores", ONE_HEAD - {"softmax", "softmax_shifted", "attention_weights"},
       name="attention_scores_edge", silences=("ffn",),
       nonfinite=frozenset({"softmax", "softmax_shifted", "attention_weights"}))
def _attention_scores_edge(data, dtype):
    """sequences of one token, one head of width 4 to 8, W_K = W_Q and the FFN silenced,
    both scaled so that the largest Q Kᵀ is 1.25 to 1.75 times float16's largest value
    while the score Q Kᵀ/√d_k stays below it: a 16-bit engine that forms Q Kᵀ before
    scaling overflows to ∞ and the weight to NaN, where the spec's weight is 1 (one
    finite score), so attention returns the value vector whatever the score's rounding."""
    config = _config(data, n_heads=1, d_model=data.draw(st.integers(4, 8), label="d_k"))
    params = _silence(_random(data, config, dtype), ffn=True)
    h = ref.layer_norm(params["wte"], params["blocks.0.ln_1.weight"],
                       params["blocks.0.ln_1.bias"], config.ln_eps)
    width = config.d_attn
    w_qkv = params["blocks.0.attn.w_qkv"]
    w_qkv[:, width:2 * width] = w_qkv[:, :width]  # Q Kᵀ = |q|², positive
    tokens = data.draw(token_arrays(config, length=1), label="tokens")
    largest = float(((h[tokens] @ w_qkv[:, :width]) ** 2).sum(axis=-1).max())
    assume(largest > 1e-6)
    target = FLOAT16_MAX * data.draw(st.sampled_from((1.25, 1.5, 1.75)), label="QKᵀ/max")
    w_qkv[:, : 2 * width] *= math.sqrt(target / largest)
    return config, params, tokens


@probe("scaled_dot_product_attention", ONE_HEAD - {"softmax", "softmax_shifted",
                                                   "attention_scores", "attention_weights"},
       name="attention_one_position", silences=("ffn",))
def _attention_one_position(data, dtype):
    """sequences of one token, one head, the attention's biases half the time and the
    FFN silenced: the weights are the softmax of one finite score, 1 whatever the score
    and however softmax or the weights are formed, so attention returns the value vector
    where the mask's diagonal is visible, through W_O."""
    config = _config(data, n_heads=1, attn_bias=data.draw(st.booleans(), label="biases"))
    params = _silence(_random(data, config, dtype), ffn=True)
    return config, params, data.draw(token_arrays(config, length=1), label="tokens")


@probe("linear", TOKEN | PRE_LN | ATTENTION - {"causal_mask", "attention_scores"}
       | {"ffn_relu", "relu", "unembed_tied", "gpt_forward"},
       nonfinite=frozenset({"causal_mask"}))
def _linear(data, dtype):
    """tied embeddings and every bias on, the biases carrying the signal: W_Q = W_K = 0,
    W_V = 0 (every value is b_V, which rows of weights summing to 1 keep) and W_1 = 0,
    so the block adds b_V W_O + b_O + relu(b_1) W_2 + b_2 to W_E[x] (every score equal,
    the mask leaving each row its diagonal, LayerNorm's outputs multiplied by zero); a
    linear map that drops or misplaces its
    bias changes the logits (W_E[x] + …) W_Eᵀ."""
    config = _config(data, tied_embeddings=True, attn_bias=True, ffn_bias=True)
    params = _random(data, config, dtype)
    params["blocks.0.attn.w_qkv"] = np.zeros_like(params["blocks.0.attn.w_qkv"])
    params["blocks.0.ffn.w_1"] = np.zeros_like(params["blocks.0.ffn.w_1"])
    return config, params, _tokens(data, config)


# --- whole blocks ---------------------------------------------------------------------------


def _block_probe(norm: str):
    def build(data, dtype):
        ffn = data.draw(st.sampled_from(tuple(FFN_ENTRIES)), label="ffn")
        config = _config(data, norm=norm, ffn=ffn, n_ctx=8, attn_bias=True, ffn_bias=True)
        return config, _random(data, config, dtype), _tokens(data, config)

    build.__doc__ = f"one {norm} block with every part active (every FFN variant, biases)."
    every_ffn = set().union(*FFN_ENTRIES.values())
    probe(f"block_{'guide' if norm == 'guide' else norm + '_ln'}",
          TOKEN | READ_OUT | ATTENTION | every_ffn | {"layer_norm"})(build)


for _norm in ("pre", "post", "guide"):
    _block_probe(_norm)


# --- properties that need nothing but logits --------------------------------------------------


@check("probe.causality", entries=("causal_mask",), kind="property",
       budget="twice the model's budget: each result is within it of the same exact value")
def causality(backend, ctx):
    """Causality through forward alone: changing the tokens from position j on changes no
    logit at a position before j (each within twice the model's budget of the other), on
    random models of every variant with contexts up to 1025."""
    @ctx.given(data=st.data())
    def _(data):
        norm = data.draw(st.sampled_from(("pre", "post", "guide")), label="norm")
        config = _config(data, norm=norm, n_ctx=max(2, _long_context(data)),
                         ffn=data.draw(st.sampled_from(tuple(FFN_ENTRIES)), label="ffn"),
                         positional_embedding=data.draw(st.booleans()))
        config, params = fit_to_backend(config, _random(data, config, ctx.precision.dtype), backend)
        params = {k: B.round_to(v, ctx.precision.dtype) for k, v in params.items()}
        tokens = _tokens(data, config, long=True)
        j = data.draw(st.integers(1, config.n_ctx - 1), label="first changed position")
        changed = tokens.copy()
        changed[:, j:] = (changed[:, j:] + 1) % config.vocab_size
        scale = B.gpt_forward_bound(tokens, params, config, ctx.precision)
        before = np.asarray(backend.forward(tokens, params, config), dtype=np.float64)
        after = np.asarray(backend.forward(changed, params, config), dtype=np.float64)
        # NaN equals NaN here, so a forward that makes NaN would pass vacuously: a
        # non-finite logit is judged against the reference instead (within the model's
        # budget), and fails where the reference's is finite
        for x, got in ((tokens, before), (changed, after)):
            if not np.isfinite(got).all():
                ctx.record("logits, where some are not finite",
                           B.compare(got, ref.gpt_forward(x, params, config), B.budget(
                               B.gpt_forward_bound(x, params, config, ctx.precision))))
        ctx.record(f"logits before position {j}, later tokens changed",
                   B.compare(after[:, :j], before[:, :j], 2 * B.budget(scale[:, :j])))


@check("probe.positions_absent", entries=("positional_embedding", "gpt_forward"),
       kind="property", budget="twice the model's budget")
def positions_absent(backend, ctx):
    """Without a positional embedding the model cannot tell positions apart: a sequence of
    one repeated token gives the same logits at every position (each within twice the
    model's budget of the first), contexts up to 1025."""
    @ctx.given(data=st.data())
    def _(data):
        norm = data.draw(st.sampled_from(("pre", "post", "guide")), label="norm")
        config = _config(data, norm=norm, n_ctx=_long_context(data))
        config, params = fit_to_backend(config, _random(data, config, ctx.precision.dtype), backend)
        params = {k: B.round_to(v, ctx.precision.dtype) for k, v in params.items()}
        token = data.draw(st.integers(0, config.vocab_size - 1), label="the token")
        tokens = np.full((1, config.n_ctx), token, dtype=np.int64)
        logits = np.asarray(backend.forward(tokens, params, config), dtype=np.float64)
        scale = B.gpt_forward_bound(tokens, params, config, ctx.precision)
        first = np.broadcast_to(logits[:, :1], logits.shape)
        ctx.record("every position against the first",
                   B.compare(logits, first, 2 * B.budget(scale)))


# --- localisation -----------------------------------------------------------------------------


# the causality property is evidence too: a later token that reaches an earlier logit
# points at the entries that mix positions (the mask; the scores it is added to; softmax,
# which acts on each row; the weights; attention as one kernel; the head reshapes)
CAUSALITY = Probe("causality", ("causal_mask",),
                  frozenset({"causal_mask", "attention_scores", "softmax", "softmax_shifted",
                             "attention_weights", "scaled_dot_product_attention",
                             "split_heads", "merge_heads", "multi_head_attention",
                             "multi_head_attention_head_sum"}),
                  None, "the causality property (probe.causality)")


def localise(outcomes: Mapping[str, bool], nonfinite: Collection[str] = ()) -> list[str]:
    """The entries the probes point at, most suspect first: ``outcomes`` maps a probe's
    name (or "causality") to whether it passed; ``nonfinite``: the failing probes whose
    logits held a NaN or ∞ where the reference's are finite. The suspects are the entries
    the failing probes isolate; each is scored by the failing probes whose support holds
    it against every probe that holds it (the Ochiai coefficient of spectrum-based fault
    localisation), and ties go to the entry a smaller failing probe isolates. A
    non-finite result also holds the entries its probe depends on only through a NaN or ∞
    (Probe.nonfinite): a zero weight does not silence a NaN. Entries the probes cannot
    tell apart (held by the same probes, isolated by the same failing ones: equal forms
    such as softmax and its shift identity) are one suspect, written "a / b"."""
    evidence = {**PROBES, "causality": CAUSALITY}
    seen = {e: passed for e, passed in outcomes.items() if e in evidence}
    failing = [e for e, passed in seen.items() if not passed]
    if not failing:
        return []
    support = {e: evidence[e].support | (evidence[e].nonfinite if e in nonfinite else set())
               for e in seen}
    scores: dict[str, float] = {}
    for entry in {name for e in failing for name in evidence[e].entries}:
        holding = [e for e in seen if entry in support[e]]
        failed = sum(1 for e in holding if not seen[e])
        scores[entry] = failed / math.sqrt(len(failing) * len(holding))

    def isolating(entry: str) -> list[str]:
        return [e for e in failing if entry in evidence[e].entries]

    def rank(entry: str) -> tuple[int, int, str]:
        first = min(isolating(entry), key=lambda e: (len(evidence[e].support), e))
        return len(evidence[first].support), evidence[first].entries.index(entry), entry

    best = max(scores.values())
    top = sorted((e for e, s in scores.items() if s >= best - 1e-12), key=rank)
    groups: dict[tuple[frozenset[str], frozenset[str]], list[str]] = {}
    for entry in top:
        alike = (frozenset(e for e in seen if entry in support[e]), frozenset(isolating(entry)))
        groups.setdefault(alike, []).append(entry)
    return [" / ".join(group) for group in groups.values()]
