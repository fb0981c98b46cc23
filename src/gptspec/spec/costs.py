"""Spec entries: costs — the size of a model and what running it takes.

Each entry is a sympy expression: with no configuration, the formula in the size symbols
(V, n_ctx, d_model, L, h, d_ff, and the head width d_k, free as in GPT-3's Table 2.1);
with a :class:`GPTConfig`, an exact integer. FLOPs follow Kaplan et al. 2020, table 1: a
multiply-add is 2 FLOPs and only matrix products count; N_mm includes the unembedding
d_model·V (tied or not), which Kaplan lists apart, because at GPT-2's sizes it is a large
share of the forward pass; attention over a full causal window costs 2·L·n_ctx·d_model
per token; a training step is 3× the forward (the backward costs two products per one).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from gptspec.spec.config import GPTConfig
from gptspec.spec.equation import Decision, Reading, Symbol, equation
from gptspec.spec.sources import BLUEPRINT, GUIDE, KAPLAN_2020, RADFORD_2019, Source

V, n_ctx, d_model, L, h, d_ff = sp.symbols("V n_ctx d_model L h d_ff", positive=True,
                                           integer=True)
B, T, s = sp.symbols("B T s", positive=True, integer=True)
d_k = sp.Symbol("d_k", positive=True, integer=True)
d_H = d_k  # the Notes' name for the head width; the pages write d_k (docs/notation.md)

SIZE_SYMBOLS = (
    Symbol("V", "()", "vocabulary size"),
    Symbol(r"n_{\mathrm{ctx}}", "()", "context length"),
    Symbol(r"d_{\mathrm{model}}", "()", "width of the residual stream"),
    Symbol("L", "()", "number of blocks"),
    Symbol(r"d_{\mathrm{ff}}", "()", "width of the feed-forward layer"),
)
_SIZE_ROWS = {s.name: s for s in SIZE_SYMBOLS} | {
    "B": Symbol("B", "()", "batch size (sequences)"),
    "T": Symbol("T", "()", "sequence length"),
    "s": Symbol("s", "()", "bytes per element (2 for bf16, 4 for float32)"),
    "h": Symbol("h", "()", "number of heads"),
    "d_k": Symbol("d_k", "()", "width of each head (d_model / h unless the head width is free)"),
}


def size_rows(*names: str, result: Symbol, parts: tuple[Symbol, ...] = ()) -> tuple[Symbol, ...]:
    """An entry's own table: its result, the counts it adds up, and the sizes it uses
    (each page lists only what its formula writes)."""
    return (result, *parts, *(_SIZE_ROWS[n] for n in names))


def _count(name: str, what: str) -> Symbol:
    return Symbol(name, "()", what)


N_E = _count("N_E", "parameters of the token embedding")
N_P = _count("N_P", "parameters of the positional embedding")
N_ATTN = _count("N_{attn}", "parameters of one block's attention")
N_FFN = _count("N_{ffn}", "parameters of one block's feed-forward layer")
N_LN = _count("N_{LN}", "parameters of one block's LayerNorms")
N_BLOCK = _count("N_{block}", "parameters of one block")
N_LN_F = _count("N_{LN_f}", "parameters of the final LayerNorm")
N_U = _count("N_U", "parameters of the unembedding")
N_MM = _count("N_{mm}", "weights a token meets in matrix products")
C_FWD = _count("C_{fwd}", "forward FLOPs per token")


@dataclass(frozen=True)
class Sizes:
    """A configuration as sympy quantities: numbers for a GPTConfig, symbols for None."""

    V: sp.Expr
    n_ctx: sp.Expr
    d: sp.Expr
    L: sp.Expr
    h: sp.Expr
    d_ff: sp.Expr
    d_attn: sp.Expr  # h·d_k: the width of Q, K, V and of W_O's input
    attn_bias: int
    ffn_bias: int
    positional: int  # 1 with a learned W_P, 0 without (the Guide)
    norms_per_block: int  # the Guide's block has one LayerNorm, the others two
    ffn_second_in: sp.Expr  # rows of W_2: d_ff, or d_model for the Guide's product FFN
    final_norm: int
    tied: int
    output_bias: int


def sizes(config: GPTConfig | None) -> Sizes:
    if config is None:
        return Sizes(V, n_ctx, d_model, L, h, d_ff, d_attn=h * d_k, attn_bias=1, ffn_bias=1,
                     positional=1, norms_per_block=2, ffn_second_in=d_ff, final_norm=1,
                     tied=1, output_bias=0)
    c = config
    I = sp.Integer
    return Sizes(I(c.vocab_size), I(c.n_ctx), I(c.d_model), I(c.n_layers), I(c.n_heads),
                 I(c.d_ff), d_attn=I(c.d_attn), attn_bias=int(c.attn_bias),
                 ffn_bias=int(c.ffn_bias), positional=int(c.positional_embedding),
                 norms_per_block=1 if c.norm == "guide" else 2,
                 ffn_second_in=I(c.d_model) if c.ffn == "guide_product" else I(c.d_ff),
                 final_norm=int(c.final_norm), tied=int(c.tied_embeddings),
                 output_bias=int(c.output_bias))


def _value(x: int | None, symbol: sp.Symbol) -> sp.Expr:
    return symbol if x is None else sp.Integer(x)


COUNT_SOURCES = (Source(RADFORD_2019, "sec. 2.3, table 2"),
                 Source(KAPLAN_2020, "sec. 2.1, table 1"))

# --- parameter counts -------------------------------------------------------------------


@equation(
    id="param_count_token_embedding",
    title="Parameters: token embedding",
    group="costs",
    latex=r"N_E = V \, d_{\mathrm{model}}",
    symbols=size_rows("V", r"d_{\mathrm{model}}", result=N_E),
    sources=(Source(BLUEPRINT, "sec. 2.1"),) + COUNT_SOURCES,
    reference="param_count_token_embedding",
)
def param_count_token_embedding(config: GPTConfig | None = None):
    c = sizes(config)
    return c.V * c.d


@equation(
    id="param_count_positional_embedding",
    title="Parameters: learned positional embedding",
    group="costs",
    latex=r"N_P = n_{\mathrm{ctx}} \, d_{\mathrm{model}}",
    notes="Zero where the model has no positional embedding (the Guide as written).",
    symbols=size_rows(r"n_{\mathrm{ctx}}", r"d_{\mathrm{model}}", result=N_P),
    sources=(Source(BLUEPRINT, "sec. 2.1"),) + COUNT_SOURCES,
    reference="param_count_positional_embedding",
)
def param_count_positional_embedding(config: GPTConfig | None = None):
    c = sizes(config)
    return c.positional * c.n_ctx * c.d


@equation(
    id="param_count_attention",
    title="Parameters: one block's multi-head attention",
    group="costs",
    latex=r"N_{attn} = 4\, d_{\mathrm{model}}\, h d_k + 3 h d_k + d_{\mathrm{model}} \quad "
          r"\text{(} W_{QKV}, W_O \text{ and their biases; } 4 d_{\mathrm{model}}^2 + 4 d_{\mathrm{model}} "
          r"\text{ when } h d_k = d_{\mathrm{model}} \text{)}",
    symbols=size_rows(r"d_{\mathrm{model}}", "h", "d_k", result=N_ATTN, parts=(
        Symbol("W_{QKV}", "(d_model, 3 h d_k)", "[W_Q | W_K | W_V]"),
        Symbol("W_O", "(h d_k, d_model)", "the output map"))),
    sources=(Source(BLUEPRINT, "eqs 2, 5"),) + COUNT_SOURCES,
    reference="param_count_attention",
    notes="With the default head width (d_k = d_model / h) the number of heads does not "
          "change the count. The biases b_Q, b_K, b_V, b_O count only where the "
          "configuration has attention biases (not the Blueprint's eqs 2 and 4).",
)
def param_count_attention(config: GPTConfig | None = None):
    c = sizes(config)
    return 3 * c.d * c.d_attn + c.d_attn * c.d + c.attn_bias * (3 * c.d_attn + c.d)


@equation(
    id="param_count_ffn",
    title="Parameters: one block's feed-forward layer",
    group="costs",
    latex=r"N_{ffn} = 2 d_{\mathrm{model}} d_{\mathrm{ff}} + d_{\mathrm{ff}} + d_{\mathrm{model}}",
    symbols=size_rows(r"d_{\mathrm{model}}", r"d_{\mathrm{ff}}", result=N_FFN),
    sources=(Source(BLUEPRINT, "eq 6"), Source(GUIDE, "sec. 4")) + COUNT_SOURCES,
    reference="param_count_ffn",
    notes="For the Guide's product FFN, W_2 reads the block input: d_model·d_model.",
)
def param_count_ffn(config: GPTConfig | None = None):
    c = sizes(config)
    return c.d * c.d_ff + c.ffn_second_in * c.d + c.ffn_bias * (c.d_ff + c.d)


@equation(
    id="param_count_block_norms",
    title="Parameters: one block's LayerNorms",
    group="costs",
    latex=r"N_{LN} = 2 \cdot 2 d_{\mathrm{model}} \quad \text{(gain and bias of both LayerNorms)}",
    symbols=size_rows(r"d_{\mathrm{model}}", result=N_LN),
    sources=(Source(BLUEPRINT, "eqs 7-8"), Source(GUIDE, "sec. 5")) + COUNT_SOURCES,
    reference="param_count_block_norms",
    notes="The Guide's block has a single LayerNorm: 2·d_model.",
)
def param_count_block_norms(config: GPTConfig | None = None):
    c = sizes(config)
    return c.norms_per_block * 2 * c.d


@equation(
    id="param_count_block",
    title="Parameters: one block",
    group="costs",
    latex=r"N_{block} = N_{attn} + N_{ffn} + N_{LN} = 12 d_{\mathrm{model}}^2 + 13 d_{\mathrm{model}} "
          r"\quad (d_{\mathrm{ff}} = 4 d_{\mathrm{model}},\ h d_k = d_{\mathrm{model}})",
    symbols=size_rows(r"d_{\mathrm{model}}", r"d_{\mathrm{ff}}", "h", "d_k", result=N_BLOCK,
                      parts=(N_ATTN, N_FFN, N_LN)),
    sources=COUNT_SOURCES,
    reference="param_count_block",
)
def param_count_block(config: GPTConfig | None = None):
    return (param_count_attention.sympy(config) + param_count_ffn.sympy(config)
            + param_count_block_norms.sympy(config))


@equation(
    id="param_count_final_norm",
    title="Parameters: final LayerNorm",
    group="costs",
    latex=r"N_{LN_f} = 2 d_{\mathrm{model}}",
    symbols=size_rows(r"d_{\mathrm{model}}", result=N_LN_F),
    sources=(Source(RADFORD_2019, "sec. 2.3"),),
    reference="param_count_final_norm",
    notes="Zero where the configuration has no final LayerNorm (the Blueprint, the Guide).",
)
def param_count_final_norm(config: GPTConfig | None = None):
    c = sizes(config)
    return c.final_norm * 2 * c.d


@equation(
    id="param_count_unembedding",
    title="Parameters: unembedding",
    group="costs",
    latex=r"N_U = 0 \ \text{(tied: } W_E^\top\text{)}, \quad "
          r"d_{\mathrm{model}} V + V \ \text{(untied, with bias)}",
    symbols=size_rows(r"d_{\mathrm{model}}", "V", result=N_U, parts=(
        Symbol("W_E", "(V, d_model)", "the token embedding, whose transpose is the tied "
               "unembedding"),)),
    sources=(Source(BLUEPRINT, "eq 9"), Source(GUIDE, "sec. 6")),
    reference="param_count_unembedding",
)
def param_count_unembedding(config: GPTConfig | None = None):
    c = sizes(config)
    return (1 - c.tied) * (c.d * c.V + c.output_bias * c.V)


@equation(
    id="param_count_total",
    title="Parameters: the whole model",
    group="costs",
    latex=r"N = N_E + N_P + L\,N_{block} + N_{LN_f} + N_U",
    symbols=size_rows("L", result=_count("N", "parameters of the whole model"),
                      parts=(N_E, N_P, N_BLOCK, N_LN_F, N_U)),
    sources=COUNT_SOURCES,
    reference="param_count_total",
    notes="GPT-2 small, medium, large and xl: 124,439,808; 354,823,168; 774,030,080; "
          "1,557,611,200.",
    decisions=(Decision(
        question="How many parameters have the GPT-2 models?",
        readings=(Reading(Source(RADFORD_2019, "table 2"), "117M, 345M, 762M, 1542M"),),
        decision="124,439,808; 354,823,168; 774,030,080; 1,557,611,200: the element counts "
                 "of the released weights, and of this formula. OpenAI later said the "
                 "paper's first two counts were in error (small and medium are 124M, 355M).",
        why="The count must equal the parameters a backend actually holds.",
    ),),
)
def param_count_total(config: GPTConfig | None = None):
    c = sizes(config)
    return (param_count_token_embedding.sympy(config)
            + param_count_positional_embedding.sympy(config)
            + c.L * param_count_block.sympy(config)
            + param_count_final_norm.sympy(config)
            + param_count_unembedding.sympy(config))


# --- compute ------------------------------------------------------------------------------

FLOP_SOURCES = (Source(KAPLAN_2020, "sec. 2.1, table 1"),)


@equation(
    id="matmul_weights_per_token",
    title="Weights a token meets in matrix products",
    group="costs",
    latex=r"N_{mm} = L\,(4 d_{\mathrm{model}}\, h d_k + 2 d_{\mathrm{model}} d_{\mathrm{ff}}) "
          r"+ d_{\mathrm{model}} V",
    symbols=size_rows("L", r"d_{\mathrm{model}}", "h", "d_k", r"d_{\mathrm{ff}}", "V", result=N_MM),
    sources=FLOP_SOURCES,
    reference="matmul_weights_per_token",
    notes="Every block's weight matrices and the unembedding (even when tied); no "
          "embedding lookup, bias or LayerNorm gain.",
)
def matmul_weights_per_token(config: GPTConfig | None = None):
    c = sizes(config)
    per_block = 4 * c.d * c.d_attn + c.d * c.d_ff + c.ffn_second_in * c.d
    return c.L * per_block + c.d * c.V


@equation(
    id="forward_flops_per_token",
    title="Forward FLOPs per token",
    group="costs",
    latex=r"C_{fwd} = 2 N_{mm} + 2 L\, n_{\mathrm{ctx}}\, h d_k",
    symbols=size_rows("L", r"n_{\mathrm{ctx}}", "h", "d_k", result=C_FWD, parts=(N_MM,)),
    sources=FLOP_SOURCES,
    reference="forward_flops_per_token",
    notes="Multiply-add = 2 FLOPs; matrix products only; the attention term is a full "
          "causal window of n_ctx (see the module's docstring for the convention).",
    decisions=(Decision(
        question="Does the forward count include the unembedding?",
        readings=(Reading(Source(KAPLAN_2020, "table 1"),
                          r"$C_{forward} \approx 2N + 2 n_{layer} n_{\mathrm{ctx}} d_{attn}$ with $N$ "
                          r"without embeddings; the de-embedding's $2 d_{\mathrm{model}} n_{vocab}$ "
                          r"listed apart"),),
        decision=r"Yes: $d_{\mathrm{model}} V$ is part of $N_{mm}$, so $2 d_{\mathrm{model}} V$ "
                 r"of the forward.",
        why="At GPT-2 small it is 77 of 266 MFLOP per token: without it, utilisation "
            "figures would read 29% low.",
    ),),
)
def forward_flops_per_token(config: GPTConfig | None = None):
    c = sizes(config)
    return 2 * matmul_weights_per_token.sympy(config) + 2 * c.L * c.n_ctx * c.d_attn


@equation(
    id="training_flops_per_token",
    title="Training FLOPs per token",
    group="costs",
    latex=r"C_{train} = 3\,C_{fwd} = 6 N_{mm} + 6 L\, n_{\mathrm{ctx}}\, h d_k",
    symbols=size_rows("L", r"n_{\mathrm{ctx}}", "h", "d_k",
                      result=_count("C_{train}", "training FLOPs per token"),
                      parts=(C_FWD, N_MM)),
    sources=FLOP_SOURCES,
    reference="training_flops_per_token",
    notes="The backward pass costs twice the forward: each product's gradient with respect "
          "to its input and to its weight is a product of the same size.",
)
def training_flops_per_token(config: GPTConfig | None = None):
    return 3 * forward_flops_per_token.sympy(config)


# --- memory ---------------------------------------------------------------------------------


@equation(
    id="kv_cache_bytes",
    title="KV-cache size",
    group="costs",
    latex=r"M_{KV} = 2 \, B \, L \, n_{\mathrm{ctx}} \, h d_k \, s",
    symbols=size_rows("B", "L", r"n_{\mathrm{ctx}}", "h", "d_k", "s",
                      result=_count("M_{KV}", "bytes of the KV cache")),
    sources=(Source(BLUEPRINT, "eq 3"),),
    reference="kv_cache_bytes",
    notes="K and V of every layer and head for a full window of n_ctx positions per "
          "sequence (the cache is preallocated at n_ctx).",
)
def kv_cache_bytes(config: GPTConfig | None = None, batch: int | None = None,
                   bytes_per_element: int | None = None):
    c = sizes(config)
    return 2 * _value(batch, B) * c.L * c.n_ctx * c.d_attn * _value(bytes_per_element, s)


@equation(
    id="activation_memory_bytes",
    title="Activation memory of a training step",
    group="costs",
    latex=r"M_{act} = B\,s\,\Big(L\,\big((2 + n_{LN})\,T d_{\mathrm{model}} + 4 T h d_k "
          r"+ 2 T d_{\mathrm{ff}} "
          r"+ h T^2\big) "
          r"+ 2 T d_{\mathrm{model}} + T V\Big)",
    symbols=size_rows(
        "B", "s", "L", "T", r"d_{\mathrm{model}}", "d_k", r"d_{\mathrm{ff}}", "h", "V",
        result=_count("M_{act}", "bytes of activations kept for the backward pass"),
        parts=(Symbol("n_{LN}", "()", "LayerNorms per block: 2, or 1 in the Guide's block"),)),
    sources=(Source(BLUEPRINT, "eqs 3-8"),),
    reference="activation_memory_bytes",
    notes="The tensors the backward pass reads, kept from the forward pass. Assumptions: "
          "no recomputation, no dropout, attention weights materialised (h·T² per layer; a "
          "fused attention kernel keeps none of them), every saved tensor in the activation "
          "dtype of s bytes, LayerNorm row statistics (O(T)) left out. Per block: the "
          "attention input, Q, K, V, the merged heads, the FFN input, the input of each "
          "LayerNorm (n_LN of them), the FFN's two hidden tensors and the attention weights; "
          "then the final LayerNorm's input and output (or the last block's output alone) "
          "and the logits.",
)
def activation_memory_bytes(config: GPTConfig | None = None, batch: int | None = None,
                            seq_len: int | None = None, bytes_per_element: int | None = None):
    c = sizes(config)
    t = _value(seq_len, T)
    # the FFN's two hidden tensors: W_1's output and the activation's, or the Guide
    # product's two pre-activations (there d_ff = d_model)
    per_block = ((2 + c.norms_per_block) * t * c.d + 4 * t * c.d_attn + 2 * t * c.d_ff
                 + c.h * t * t)
    head = (1 + c.final_norm) * t * c.d + t * c.V
    return _value(batch, B) * _value(bytes_per_element, s) * (c.L * per_block + head)
