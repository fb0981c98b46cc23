"""The forward pass in JAX, one function per spec entry, written from the equations.

Each function has the name and argument order of its entry's reference function and
takes and returns ``jax.Array``s of the backend's dtype. They are pure functions of arrays
and static values (ints, floats, a ``GPTConfig``), so :mod:`gptspec.adapters.jax.backend`
can jit-compile any of them, and ``gpt_forward`` is built from these same functions.
Precision (the contract of ``gptspec.conformance.budgets``): for a 16-bit dtype every
operation widens its inputs to float32 (exact), computes there — sums, products,
exponentials, LayerNorm statistics — and rounds its result once (``_store``), as a fused
16-bit kernel with float32 accumulation would.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.scipy.special import erf

from gptspec.spec.config import GPTConfig
from gptspec.spec.operations import operations_in

Array = jax.Array


HALF_DTYPES = (jnp.bfloat16, jnp.float16)


def accumulation_dtype(dtype: jnp.dtype) -> jnp.dtype:
    """float32 for a 16-bit dtype (its sums and internals run there), else the dtype."""
    return jnp.dtype(jnp.float32) if dtype in HALF_DTYPES else jnp.dtype(dtype)


def _wide(x: Array) -> Array:
    """``x`` in its accumulation dtype (exact: every 16-bit value is a float32 value)."""
    return x.astype(accumulation_dtype(x.dtype))


def _store(y: Array, dtype: jnp.dtype) -> Array:
    """The one rounding of a result to the backend's dtype."""
    return y.astype(dtype)


# --- embedding -------------------------------------------------------------------------


def one_hot(tokens: Array, vocab_size: int, dtype: jnp.dtype = jnp.float32) -> Array:
    """X[t, v] = 1 if x_t = v else 0."""
    return (tokens[..., None] == jnp.arange(vocab_size)).astype(dtype)


def token_embedding_one_hot(X: Array, W_E: Array) -> Array:
    """E = X W_E (one-hot rows: every sum adds zeros to one row of W_E, exactly)."""
    return _store(_wide(X) @ _wide(W_E), W_E.dtype)


def token_embedding(tokens: Array, W_E: Array) -> Array:
    """e_t = W_E[x_t]: row selection (ids are checked before they reach a jitted call:
    jnp's indexing would clamp an id outside [0, V) rather than refuse it). Selected from
    the widened matrix, so that the gradient's scatter-add over a token's repeats runs in
    the accumulation dtype (in W_E's 16-bit dtype it is one rounding per repeat); the
    rows themselves are the same numbers."""
    return _store(jnp.take(_wide(W_E), tokens, axis=0), W_E.dtype)


def positional_embedding(T: int, W_P: Array) -> Array:
    """P = rows 0 … T−1 of W_P."""
    return W_P[:T]


def input_representation(E: Array, P: Array) -> Array:
    """h_t⁽⁰⁾ = e_t + p_t (Blueprint sec. 2.1)."""
    return _store(_wide(E) + _wide(P), E.dtype)


# --- linear maps and attention -----------------------------------------------------------


def linear(x: Array, W: Array, b: Array | None = None) -> Array:
    """y = x W + b with W of shape (in, out): the product and the bias in the accumulation
    dtype, one rounding."""
    y = _wide(x) @ _wide(W)
    if b is not None:
        y = y + _wide(b)
    return _store(y, x.dtype)


def qkv_projection(H: Array, W_qkv: Array, b_qkv: Array | None = None
                   ) -> tuple[Array, Array, Array]:
    """Q, K, V = H [W_Q | W_K | W_V] + b (Blueprint eq 2): one product, three column blocks."""
    QKV = linear(H, W_qkv, b_qkv)
    d = QKV.shape[-1] // 3
    return QKV[..., :d], QKV[..., d : 2 * d], QKV[..., 2 * d :]


def split_heads(X: Array, n_heads: int) -> Array:
    """(…, T, d) → (…, h, T, d_k): head i takes columns i·d_k … (i+1)·d_k − 1."""
    *lead, T, d = X.shape
    return jnp.swapaxes(X.reshape(*lead, T, n_heads, d // n_heads), -3, -2)


def merge_heads(X: Array) -> Array:
    """Concat(head_1, …, head_h): (…, h, T, d_k) → (…, T, h·d_k)."""
    *lead, h, T, dk = X.shape
    return jnp.swapaxes(X, -3, -2).reshape(*lead, T, h * dk)


def causal_mask(T: int, dtype: jnp.dtype = jnp.float32) -> Array:
    """M[i, j] = 0 if j ≤ i else −∞."""
    future = jnp.arange(T)[None, :] > jnp.arange(T)[:, None]
    return jnp.where(future, -jnp.inf, 0.0).astype(dtype)


def _softmax_wide(z: Array, c: Array, axis: int) -> Array:
    e = jnp.exp(z - c)
    return e / jnp.sum(e, axis=axis, keepdims=True)


def softmax_shifted(z: Array, c: Array, axis: int = -1) -> Array:
    """exp(z − c) / Σ exp(z − c), equal to softmax(z) for every finite c."""
    return _store(_softmax_wide(_wide(z), _wide(jnp.asarray(c, z.dtype)), axis), z.dtype)


def softmax(z: Array, axis: int = -1) -> Array:
    """softmax(z)_i = exp(z_i) / Σ_j exp(z_j), through the shift identity with c = max z
    (no exponential overflows)."""
    zw = _wide(z)
    return _store(_softmax_wide(zw, jnp.max(zw, axis=axis, keepdims=True), axis), z.dtype)


def _scores_wide(Q: Array, K: Array, M: Array) -> Array:
    return _wide(Q) @ jnp.swapaxes(_wide(K), -1, -2) / math.sqrt(Q.shape[-1]) + _wide(M)


def attention_scores(Q: Array, K: Array, M: Array) -> Array:
    """S = Q Kᵀ / √d_k + M."""
    return _store(_scores_wide(Q, K, M), Q.dtype)


def attention_weights(Q: Array, K: Array, M: Array) -> Array:
    """A = softmax(S), row by row (the scores stay in the accumulation dtype)."""
    S = _scores_wide(Q, K, M)
    return _store(_softmax_wide(S, jnp.max(S, axis=-1, keepdims=True), -1), Q.dtype)


def scaled_dot_product_attention(Q: Array, K: Array, V: Array, M: Array) -> Array:
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V (Blueprint eq 3), fused: scores,
    weights and their product with V in the accumulation dtype, one rounding at the end."""
    S = _scores_wide(Q, K, M)
    A = _softmax_wide(S, jnp.max(S, axis=-1, keepdims=True), -1)
    return _store(A @ _wide(V), Q.dtype)


def _causal_heads(H: Array, W_qkv: Array, b_qkv: Array | None, n_heads: int) -> Array:
    """Every head's causal attention, stacked: (…, h, T, d_k)."""
    Q, K, V = (split_heads(X, n_heads) for X in qkv_projection(H, W_qkv, b_qkv))
    return scaled_dot_product_attention(Q, K, V, causal_mask(H.shape[-2], H.dtype))


def multi_head_attention(H: Array, W_qkv: Array, b_qkv: Array | None, W_O: Array,
                         b_O: Array | None, n_heads: int) -> Array:
    """MultiHead(H) = Concat(head_1, …, head_h) W_O + b_O (Blueprint eqs 4–5), causal."""
    return linear(merge_heads(_causal_heads(H, W_qkv, b_qkv, n_heads)), W_O, b_O)


def multi_head_attention_head_sum(H: Array, W_qkv: Array, b_qkv: Array | None, W_O: Array,
                                  b_O: Array | None, n_heads: int) -> Array:
    """Σ_i head_i W_O⁽ⁱ⁾ + b_O, W_O⁽ⁱ⁾ the rows i·d_k … (i+1)·d_k − 1 of W_O: one
    contraction over heads and their features."""
    heads = _causal_heads(H, W_qkv, b_qkv, n_heads)
    W_heads = W_O.reshape(n_heads, W_O.shape[0] // n_heads, W_O.shape[1])
    out = jnp.einsum("...htk,hkd->...td", _wide(heads), _wide(W_heads))
    if b_O is not None:
        out = out + _wide(b_O)
    return _store(out, H.dtype)


# --- normalisation and feed-forward ------------------------------------------------------


def layer_norm(x: Array, gamma: Array, beta: Array, eps: float) -> Array:
    """LN(x) = γ ⊙ (x − μ) / √(σ² + ε) + β over the last axis, σ² the biased variance
    (the mean of the centred squares, so no cancellation in E[x²] − μ²)."""
    xw = _wide(x)
    centred = xw - jnp.mean(xw, axis=-1, keepdims=True)
    var = jnp.mean(centred * centred, axis=-1, keepdims=True)
    return _store(_wide(gamma) * (centred / jnp.sqrt(var + eps)) + _wide(beta), x.dtype)


def relu(x: Array) -> Array:
    """max(0, x)."""
    return jnp.maximum(x, jnp.zeros((), x.dtype))


def gelu(x: Array) -> Array:
    """x Φ(x) = x · ½ (1 + erf(x / √2))."""
    xw = _wide(x)
    return _store(0.5 * xw * (1.0 + erf(xw / math.sqrt(2.0))), x.dtype)


def gelu_tanh(x: Array) -> Array:
    """½ x (1 + tanh(√(2/π) (x + 0.044715 x³)))."""
    xw = _wide(x)
    inner = math.sqrt(2.0 / math.pi) * (xw + 0.044715 * xw * xw * xw)
    return _store(0.5 * xw * (1.0 + jnp.tanh(inner)), x.dtype)


def _ffn(act: Callable[[Array], Array], x: Array, W_1: Array, b_1: Array | None, W_2: Array,
         b_2: Array | None) -> Array:
    return linear(act(linear(x, W_1, b_1)), W_2, b_2)


def ffn_relu(x: Array, W_1: Array, b_1: Array | None, W_2: Array, b_2: Array | None) -> Array:
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (Blueprint eq 6)."""
    return _ffn(relu, x, W_1, b_1, W_2, b_2)


def ffn_gelu(x: Array, W_1: Array, b_1: Array | None, W_2: Array, b_2: Array | None) -> Array:
    """FFN(x) = GELU(x W_1 + b_1) W_2 + b_2."""
    return _ffn(gelu, x, W_1, b_1, W_2, b_2)


def ffn_gelu_tanh(x: Array, W_1: Array, b_1: Array | None, W_2: Array, b_2: Array | None
                  ) -> Array:
    """FFN(x) = GELU_tanh(x W_1 + b_1) W_2 + b_2 (GPT-2, GPT-3)."""
    return _ffn(gelu_tanh, x, W_1, b_1, W_2, b_2)


def ffn_guide_product(x: Array, W_1: Array, b_1: Array | None, W_2: Array, b_2: Array | None
                      ) -> Array:
    """FFNN(x) = σ(x W_1 + b_1) ⊙ σ(x W_2 + b_2) with σ = ReLU (Guide sec. 4, literally)."""
    return _store(_wide(relu(linear(x, W_1, b_1))) * _wide(relu(linear(x, W_2, b_2))), x.dtype)


FFN = {"relu": ffn_relu, "gelu": ffn_gelu, "gelu_tanh": ffn_gelu_tanh,
       "guide_product": ffn_guide_product}


# --- blocks --------------------------------------------------------------------------------


def _ln(H: Array, p: dict, which: str, config: GPTConfig) -> Array:
    return layer_norm(H, p[f"{which}.weight"], p[f"{which}.bias"], config.ln_eps)


def _attn(H: Array, p: dict, config: GPTConfig) -> Array:
    return multi_head_attention(H, p["attn.w_qkv"], p.get("attn.b_qkv"), p["attn.w_o"],
                                p.get("attn.b_o"), config.n_heads)


def _ffn_of(H: Array, p: dict, config: GPTConfig) -> Array:
    return FFN[config.ffn](H, p["ffn.w_1"], p.get("ffn.b_1"), p["ffn.w_2"], p.get("ffn.b_2"))


def _add(a: Array, b: Array) -> Array:
    """A residual sum, rounded once."""
    return _store(_wide(a) + _wide(b), a.dtype)


def block_pre_ln(H: Array, p: dict, config: GPTConfig) -> Array:
    """H' = H + MultiHead(LN_1(H)); H_out = H' + FFN(LN_2(H')) (GPT-2, GPT-3). ``p``: one
    block's parameters, named without the ``blocks.{l}.`` prefix."""
    H = _add(H, _attn(_ln(H, p, "ln_1", config), p, config))
    return _add(H, _ffn_of(_ln(H, p, "ln_2", config), p, config))


def block_post_ln(H: Array, p: dict, config: GPTConfig) -> Array:
    """H' = LN_1(H + MultiHead(H)); H_out = LN_2(H' + FFN(H')) (Blueprint eqs 7–8)."""
    H = _ln(_add(H, _attn(H, p, config)), p, "ln_1", config)
    return _ln(_add(H, _ffn_of(H, p, config)), p, "ln_2", config)


def block_guide(H: Array, p: dict, config: GPTConfig) -> Array:
    """H⁽ˡ⁺¹⁾ = LN(FFNN(Attention(H⁽ˡ⁾)) + H⁽ˡ⁾) (Guide sec. 5): one residual, one LayerNorm."""
    return _ln(_add(_ffn_of(_attn(H, p, config), p, config), H), p, "ln_1", config)


BLOCK = {"pre": block_pre_ln, "post": block_post_ln, "guide": block_guide}


# --- output --------------------------------------------------------------------------------


def final_layer_norm(H: Array, gamma: Array, beta: Array, eps: float) -> Array:
    """H_f = LN_f(H) after the last block (GPT-2, GPT-3)."""
    return layer_norm(H, gamma, beta, eps)


def unembed_tied(H: Array, W_E: Array) -> Array:
    """logits = H W_Eᵀ (Blueprint eq 9)."""
    return _store(_wide(H) @ _wide(W_E).T, H.dtype)


def unembed_untied(H: Array, W_U: Array, b_U: Array | None = None) -> Array:
    """logits = H W_U + b_U (the Guide's single output projection)."""
    return linear(H, W_U, b_U)


def next_token_distribution(logits: Array) -> Array:
    """P(x_{t+1} = v | x_{≤t}) = softmax(logits_t)_v (Blueprint eq 9)."""
    return softmax(logits, axis=-1)


def log_softmax_wide(z: Array) -> Array:
    """log softmax(z) over the last axis, in the accumulation dtype: (z − max) − log Σ exp."""
    zw = _wide(z)
    shifted = zw - jnp.max(zw, axis=-1, keepdims=True)
    return shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True))


def sequence_log_probability(tokens: Array, logits: Array) -> Array:
    """log P(x_2 … x_T | x_1) = Σ_{t=2}^{T} log P(x_t | x_{<t}) (Blueprint eq 1). Row t−1
    of ``logits`` predicts x_t. The result stays in the accumulation dtype."""
    log_p = log_softmax_wide(logits[..., :-1, :])
    picked = jnp.take_along_axis(log_p, tokens[..., 1:, None], axis=-1)[..., 0]
    return jnp.sum(picked, axis=-1)


# --- the whole model -------------------------------------------------------------------------


def block_parameters(params: dict, layer: int) -> dict:
    """One block's parameters, without the ``blocks.{layer}.`` prefix."""
    prefix = f"blocks.{layer}."
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def gpt_forward(tokens: Array, params: dict, config: GPTConfig) -> Array:
    """logits = unembed(LN_f(block_L(… block_1(W_E[x] + W_P[:T])))): (…, T) → (…, T, V)."""
    T = tokens.shape[-1]
    H = token_embedding(tokens, params["wte"])
    if config.positional_embedding:  # the Guide as written has none
        H = input_representation(H, positional_embedding(T, params["wpe"]))
    for layer in range(config.n_layers):
        H = BLOCK[config.norm](H, block_parameters(params, layer), config)
    if config.final_norm:
        H = final_layer_norm(H, params["ln_f.weight"], params["ln_f.bias"], config.ln_eps)
    if config.tied_embeddings:
        return unembed_tied(H, params["wte"])
    return unembed_untied(H, params["w_u"], params.get("b_u"))


# every optional operation of the model this module writes, read from the spec registry
__all__ = operations_in(globals())
