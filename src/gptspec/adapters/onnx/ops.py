"""The forward pass as ONNX nodes, one function per spec entry, written from the equations.

Each function has the name and argument order of its entry's reference function, with a
:class:`Graph` first: array arguments are names of values in that graph (``None`` for an
absent bias), the rest (ints, floats, a ``GPTConfig``) fixed when the graph is built;
each returns the name(s) of its result. ``gpt_forward`` is built from these same
functions, so one operation's graph is exactly the piece of the model's graph that
computes it. Precision (the contract of ``gptspec.conformance.budgets``): values are
stored in the graph's dtype; an operation widens its inputs to float32, computes there
and rounds its result once (``Graph.wide``, ``Graph.stored``), as a fused 16-bit kernel
with float32 accumulation would.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gptspec.adapters.onnx.graph import FLOAT, Graph
from gptspec.spec.config import GPTConfig
from gptspec.spec.operations import operations_in

Name = str



def _swap_last_two(g: Graph, x: Name, first: int) -> Name:
    """Transpose swapping axes ``first`` and ``first + 1`` (counted from the end)."""
    r = g.rank[x]
    perm = list(range(r))
    perm[r + first], perm[r + first + 1] = perm[r + first + 1], perm[r + first]
    return g.op("Transpose", x, perm=perm)


def _length(g: Graph, T: Name | int) -> Name:
    """A length as a 1-D int64 value: a constant when fixed, else the value given."""
    return g.ints(T) if isinstance(T, int) else T


# --- embedding -------------------------------------------------------------------------


def one_hot(g: Graph, tokens: Name, vocab_size: int) -> Name:
    """X[t, v] = 1 if x_t = v else 0: each id compared with 0 … V − 1."""
    ids = g.op("Range", g.const(0, np.int64), g.const(vocab_size, np.int64),
               g.const(1, np.int64), rank=1)
    hit = g.op("Equal", g.op("Unsqueeze", tokens, g.ints(-1), rank=g.rank[tokens] + 1), ids)
    return g.op("Cast", hit, to=g.store_type)


def token_embedding_one_hot(g: Graph, X: Name, W_E: Name) -> Name:
    """E = X W_E (one-hot rows: every sum adds zeros to one row of W_E, exactly)."""
    return g.stored(g.op("MatMul", g.wide(X), g.wide(W_E)))


def token_embedding(g: Graph, tokens: Name, W_E: Name) -> Name:
    """e_t = W_E[x_t]: row selection (ids outside [0, V) are refused before the run)."""
    return g.op("Gather", W_E, tokens, axis=0, rank=g.rank[tokens] + 1)


def positional_embedding(g: Graph, T: Name | int, W_P: Name) -> Name:
    """P = rows 0 … T−1 of W_P."""
    return g.op("Slice", W_P, g.ints(0), _length(g, T), g.ints(0))


def input_representation(g: Graph, E: Name, P: Name) -> Name:
    """h_t⁽⁰⁾ = e_t + p_t (Blueprint sec. 2.1)."""
    return g.stored(g.op("Add", g.wide(E), g.wide(P)))


# --- linear maps and attention -----------------------------------------------------------


def _linear_wide(g: Graph, x: Name, W: Name, b: Name | None) -> Name:
    y = g.op("MatMul", g.wide(x), g.wide(W))
    return y if b is None else g.op("Add", y, g.wide(b))


def linear(g: Graph, x: Name, W: Name, b: Name | None = None) -> Name:
    """y = x W + b with W of shape (in, out): product and bias in float32, one rounding."""
    return g.stored(_linear_wide(g, x, W, b))


def qkv_projection(g: Graph, H: Name, W_qkv: Name, b_qkv: Name | None = None
                   ) -> tuple[Name, Name, Name]:
    """Q, K, V = H [W_Q | W_K | W_V] + b (Blueprint eq 2): one product, three column blocks."""
    QKV = linear(g, H, W_qkv, b_qkv)
    Q, K, V = g.op("Split", QKV, axis=-1, num_outputs=3, outputs=3)
    return Q, K, V


def split_heads(g: Graph, X: Name, n_heads: int) -> Name:
    """(…, T, d) → (…, h, T, d_k): head i takes columns i·d_k … (i+1)·d_k − 1."""
    r = g.rank[X]
    # 0 keeps an axis's size: (…, T, d) → (…, T, h, d_k), then T and h swap
    shape = g.ints(*([0] * (r - 1)), n_heads, -1)
    return _swap_last_two(g, g.op("Reshape", X, shape, rank=r + 1), -3)


def merge_heads(g: Graph, X: Name) -> Name:
    """Concat(head_1, …, head_h): (…, h, T, d_k) → (…, T, h·d_k)."""
    r = g.rank[X]
    return g.op("Reshape", _swap_last_two(g, X, -3), g.ints(*([0] * (r - 2)), -1),
                rank=r - 1)


def causal_mask(g: Graph, T: Name | int) -> Name:
    """M[i, j] = 0 if j ≤ i else −∞: the future (j > i) masked."""
    positions = g.op("Range", g.const(0, np.int64),
                     g.op("Squeeze", _length(g, T), g.ints(0), rank=0),
                     g.const(1, np.int64), rank=1)
    rows = g.op("Unsqueeze", positions, g.ints(1), rank=2)
    cols = g.op("Unsqueeze", positions, g.ints(0), rank=2)
    future = g.op("Greater", cols, rows)
    mask = g.op("Where", future, g.const(-np.inf, np.float32), g.const(0.0, np.float32))
    return g.stored(mask)


def softmax_shifted(g: Graph, z: Name, c: Name | float, axis: int = -1) -> Name:
    """exp(z − c) / Σ exp(z − c), equal to softmax(z) for every finite c."""
    c_name = c if isinstance(c, str) else g.const(c, np.float32)
    e = g.op("Exp", g.op("Sub", g.wide(z), g.wide(c_name)))
    return g.stored(g.op("Div", e, g.op("ReduceSum", e, g.ints(axis), keepdims=1)))


def softmax(g: Graph, z: Name, axis: int = -1) -> Name:
    """softmax(z)_i = exp(z_i) / Σ_j exp(z_j): ONNX's Softmax on one axis."""
    return g.stored(g.op("Softmax", g.wide(z), axis=axis))


def _scores_wide(g: Graph, Q: Name, K: Name, M: Name) -> Name:
    """Q Kᵀ / √d_k + M in float32, d_k read from Q's last axis when the graph runs."""
    d_k = g.op("Cast", g.op("Shape", Q, start=-1, rank=1), to=FLOAT)
    product = g.op("MatMul", g.wide(Q), _swap_last_two(g, g.wide(K), -2))
    return g.op("Add", g.op("Div", product, g.op("Sqrt", d_k)), g.wide(M))


def attention_scores(g: Graph, Q: Name, K: Name, M: Name) -> Name:
    """S = Q Kᵀ / √d_k + M."""
    return g.stored(_scores_wide(g, Q, K, M))


def attention_weights(g: Graph, Q: Name, K: Name, M: Name) -> Name:
    """A = softmax(S), row by row (the scores stay in float32)."""
    return g.stored(g.op("Softmax", _scores_wide(g, Q, K, M), axis=-1))


def scaled_dot_product_attention(g: Graph, Q: Name, K: Name, V: Name, M: Name) -> Name:
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V (Blueprint eq 3): scores, weights and
    their product with V in float32, one rounding at the end."""
    A = g.op("Softmax", _scores_wide(g, Q, K, M), axis=-1)
    return g.stored(g.op("MatMul", A, g.wide(V)))


def _causal_heads(g: Graph, H: Name, W_qkv: Name, b_qkv: Name | None, n_heads: int) -> Name:
    """Every head's causal attention, stacked: (…, h, T, d_k)."""
    Q, K, V = (split_heads(g, X, n_heads) for X in qkv_projection(g, H, W_qkv, b_qkv))
    T = g.op("Shape", H, start=-2, end=-1, rank=1)
    return scaled_dot_product_attention(g, Q, K, V, causal_mask(g, T))


def multi_head_attention(g: Graph, H: Name, W_qkv: Name, b_qkv: Name | None, W_O: Name,
                         b_O: Name | None, n_heads: int) -> Name:
    """MultiHead(H) = Concat(head_1, …, head_h) W_O + b_O (Blueprint eqs 4–5), causal."""
    return linear(g, merge_heads(g, _causal_heads(g, H, W_qkv, b_qkv, n_heads)), W_O, b_O)


def multi_head_attention_head_sum(g: Graph, H: Name, W_qkv: Name, b_qkv: Name | None,
                                  W_O: Name, b_O: Name | None, n_heads: int) -> Name:
    """Σ_i head_i W_O⁽ⁱ⁾ + b_O, W_O⁽ⁱ⁾ the rows i·d_k … (i+1)·d_k − 1 of W_O: each head's
    product with its rows (a batched MatMul over heads), then the sum over heads."""
    heads = _causal_heads(g, H, W_qkv, b_qkv, n_heads)
    d_out = g.op("Shape", W_O, start=-1, rank=1)
    W_heads = g.op("Reshape", W_O, g.op("Concat", g.ints(n_heads, -1), d_out, axis=0),
                   rank=3)  # (h, d_k, d)
    per_head = g.op("MatMul", g.wide(heads), g.wide(W_heads))  # (…, h, T, d)
    out = g.op("ReduceSum", per_head, g.ints(-3), keepdims=0, rank=g.rank[per_head] - 1)
    return g.stored(out if b_O is None else g.op("Add", out, g.wide(b_O)))


# --- normalisation and feed-forward ------------------------------------------------------


def layer_norm(g: Graph, x: Name, gamma: Name, beta: Name, eps: float) -> Name:
    """LN(x) = γ ⊙ (x − μ) / √(σ² + ε) + β over the last axis: ONNX's LayerNormalization,
    statistics in float32 (stash_type 1)."""
    y = g.op("LayerNormalization", g.wide(x), g.wide(gamma), g.wide(beta), axis=-1,
             epsilon=float(eps), stash_type=1)
    return g.stored(y)


def relu(g: Graph, x: Name) -> Name:
    """max(0, x) (exact in any dtype)."""
    return g.stored(g.op("Relu", g.wide(x)))


def gelu(g: Graph, x: Name) -> Name:
    """x Φ(x) = x · ½ (1 + erf(x / √2)): ONNX's Gelu, exact form."""
    return g.stored(g.op("Gelu", g.wide(x), approximate="none"))


def gelu_tanh(g: Graph, x: Name) -> Name:
    """½ x (1 + tanh(√(2/π) (x + 0.044715 x³))): ONNX's Gelu, tanh form."""
    return g.stored(g.op("Gelu", g.wide(x), approximate="tanh"))


def _ffn(act: Callable[[Graph, Name], Name], g: Graph, x: Name, W_1: Name, b_1: Name | None,
         W_2: Name, b_2: Name | None) -> Name:
    return linear(g, act(g, linear(g, x, W_1, b_1)), W_2, b_2)


def ffn_relu(g: Graph, x: Name, W_1: Name, b_1: Name | None, W_2: Name, b_2: Name | None
             ) -> Name:
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (Blueprint eq 6)."""
    return _ffn(relu, g, x, W_1, b_1, W_2, b_2)


def ffn_gelu(g: Graph, x: Name, W_1: Name, b_1: Name | None, W_2: Name, b_2: Name | None
             ) -> Name:
    """FFN(x) = GELU(x W_1 + b_1) W_2 + b_2."""
    return _ffn(gelu, g, x, W_1, b_1, W_2, b_2)


def ffn_gelu_tanh(g: Graph, x: Name, W_1: Name, b_1: Name | None, W_2: Name,
                  b_2: Name | None) -> Name:
    """FFN(x) = GELU_tanh(x W_1 + b_1) W_2 + b_2 (GPT-2, GPT-3)."""
    return _ffn(gelu_tanh, g, x, W_1, b_1, W_2, b_2)


def ffn_guide_product(g: Graph, x: Name, W_1: Name, b_1: Name | None, W_2: Name,
                      b_2: Name | None) -> Name:
    """FFNN(x) = σ(x W_1 + b_1) ⊙ σ(x W_2 + b_2) with σ = ReLU (Guide sec. 4, literally)."""
    left, right = relu(g, linear(g, x, W_1, b_1)), relu(g, linear(g, x, W_2, b_2))
    return g.stored(g.op("Mul", g.wide(left), g.wide(right)))


FFN = {"relu": ffn_relu, "gelu": ffn_gelu, "gelu_tanh": ffn_gelu_tanh,
       "guide_product": ffn_guide_product}


# --- blocks --------------------------------------------------------------------------------


def _ln(g: Graph, H: Name, p: dict, which: str, config: GPTConfig) -> Name:
    return layer_norm(g, H, p[f"{which}.weight"], p[f"{which}.bias"], config.ln_eps)


def _attn(g: Graph, H: Name, p: dict, config: GPTConfig) -> Name:
    return multi_head_attention(g, H, p["attn.w_qkv"], p.get("attn.b_qkv"), p["attn.w_o"],
                                p.get("attn.b_o"), config.n_heads)


def _ffn_of(g: Graph, H: Name, p: dict, config: GPTConfig) -> Name:
    return FFN[config.ffn](g, H, p["ffn.w_1"], p.get("ffn.b_1"), p["ffn.w_2"], p.get("ffn.b_2"))


def _add(g: Graph, a: Name, b: Name) -> Name:
    """A residual sum, rounded once."""
    return g.stored(g.op("Add", g.wide(a), g.wide(b)))


def block_pre_ln(g: Graph, H: Name, p: dict, config: GPTConfig) -> Name:
    """H' = H + MultiHead(LN_1(H)); H_out = H' + FFN(LN_2(H')) (GPT-2, GPT-3). ``p``: one
    block's parameters, named without the ``blocks.{l}.`` prefix."""
    H = _add(g, H, _attn(g, _ln(g, H, p, "ln_1", config), p, config))
    return _add(g, H, _ffn_of(g, _ln(g, H, p, "ln_2", config), p, config))


def block_post_ln(g: Graph, H: Name, p: dict, config: GPTConfig) -> Name:
    """H' = LN_1(H + MultiHead(H)); H_out = LN_2(H' + FFN(H')) (Blueprint eqs 7–8)."""
    H = _ln(g, _add(g, H, _attn(g, H, p, config)), p, "ln_1", config)
    return _ln(g, _add(g, H, _ffn_of(g, H, p, config)), p, "ln_2", config)


def block_guide(g: Graph, H: Name, p: dict, config: GPTConfig) -> Name:
    """H⁽ˡ⁺¹⁾ = LN(FFNN(Attention(H⁽ˡ⁾)) + H⁽ˡ⁾) (Guide sec. 5): one residual, one LayerNorm."""
    return _ln(g, _add(g, _ffn_of(g, _attn(g, H, p, config), p, config), H), p, "ln_1", config)


BLOCK = {"pre": block_pre_ln, "post": block_post_ln, "guide": block_guide}


# --- output --------------------------------------------------------------------------------


def final_layer_norm(g: Graph, H: Name, gamma: Name, beta: Name, eps: float) -> Name:
    """H_f = LN_f(H) after the last block (GPT-2, GPT-3)."""
    return layer_norm(g, H, gamma, beta, eps)


def unembed_tied(g: Graph, H: Name, W_E: Name) -> Name:
    """logits = H W_Eᵀ (Blueprint eq 9)."""
    return g.stored(g.op("MatMul", g.wide(H), g.op("Transpose", g.wide(W_E), perm=[1, 0])))


def unembed_untied(g: Graph, H: Name, W_U: Name, b_U: Name | None = None) -> Name:
    """logits = H W_U + b_U (the Guide's single output projection)."""
    return linear(g, H, W_U, b_U)


def next_token_distribution(g: Graph, logits: Name) -> Name:
    """P(x_{t+1} = v | x_{≤t}) = softmax(logits_t)_v (Blueprint eq 9)."""
    return softmax(g, logits, axis=-1)


def sequence_log_probability(g: Graph, tokens: Name, logits: Name) -> Name:
    """log P(x_2 … x_T | x_1) = Σ_{t=2}^{T} log P(x_t | x_{<t}) (Blueprint eq 1): ONNX's
    LogSoftmax on the rows that predict x_2 … x_T, each row's next-token entry picked, summed.
    The result stays in float32."""
    r = g.rank[logits]
    rows = g.op("Slice", g.wide(logits), g.ints(0), g.ints(-1), g.ints(r - 2))
    nxt = g.op("Slice", tokens, g.ints(1), g.ints(np.iinfo(np.int64).max), g.ints(r - 2))
    picked = g.op("GatherElements", g.op("LogSoftmax", rows, axis=-1),
                  g.op("Unsqueeze", nxt, g.ints(-1), rank=r), axis=-1)  # (…, T−1, 1)
    # One explicit zero term: with T = 1 the sum is empty, and ONNX Runtime 1.31's
    # ReduceSum returns an empty input unreduced (shape (0, 1)) instead of 0.
    zero = g.op("Expand", g.const(np.zeros((1, 1), np.float32)), g.op(
        "Concat", g.op("Shape", picked, end=-2, rank=1), g.ints(1, 1), axis=0), rank=r)
    terms = g.op("Concat", zero, picked, axis=-2)
    return g.op("ReduceSum", terms, g.ints(-2, -1), keepdims=0, rank=r - 2)


# --- the whole model -------------------------------------------------------------------------


def block_parameters(params: dict, layer: int) -> dict:
    """One block's parameters, without the ``blocks.{layer}.`` prefix."""
    prefix = f"blocks.{layer}."
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def gpt_forward(g: Graph, tokens: Name, params: dict, config: GPTConfig) -> Name:
    """logits = unembed(LN_f(block_L(… block_1(W_E[x] + W_P[:T])))): (…, T) → (…, T, V);
    W_E[x] alone for a model without positional embedding."""
    H = token_embedding(g, tokens, params["wte"])
    if config.positional_embedding:
        T = g.op("Shape", tokens, start=-1, rank=1)
        H = input_representation(g, H, positional_embedding(g, T, params["wpe"]))
    for layer in range(config.n_layers):
        H = BLOCK[config.norm](g, H, block_parameters(params, layer), config)
    if config.final_norm:
        H = final_layer_norm(g, H, params["ln_f.weight"], params["ln_f.bias"], config.ln_eps)
    if config.tied_embeddings:
        return unembed_tied(g, H, params["wte"])
    return unembed_untied(g, H, params["w_u"], params.get("b_u"))


# every optional operation of the model this module writes, read from the spec registry
__all__ = operations_in(globals())
