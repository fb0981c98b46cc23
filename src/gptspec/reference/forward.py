"""The forward pass, transcribed literally in float64 NumPy: one function per spec entry.

Each function carries the id of its spec entry as its name; read it beside the
equation (``gptspec.spec.REGISTRY[name]``). Row-vector convention: a sequence is an
array of shape (..., T, d) whose rows are the token vectors; leading axes are batch.
"""

from __future__ import annotations

import math

import numpy as np

from gptspec.spec.config import GPTConfig

Array = np.ndarray

__all__ = [
    "one_hot",
    "token_embedding_one_hot",
    "token_embedding",
    "positional_embedding",
    "input_representation",
    "linear",
    "qkv_projection",
    "split_heads",
    "merge_heads",
    "causal_mask",
    "softmax_shifted",
    "softmax",
    "attention_scores",
    "attention_weights",
    "scaled_dot_product_attention",
    "multi_head_attention",
    "multi_head_attention_head_sum",
    "layer_norm",
    "relu",
    "gelu",
    "gelu_tanh",
    "ffn_relu",
    "ffn_gelu",
    "ffn_gelu_tanh",
    "ffn_guide_product",
    "block_pre_ln",
    "block_post_ln",
    "block_guide",
    "final_layer_norm",
    "unembed_tied",
    "unembed_untied",
    "next_token_distribution",
    "sequence_log_probability",
    "gpt_forward",
]


def _f64(x) -> Array:
    return np.asarray(x, dtype=np.float64)


# --- embedding -------------------------------------------------------------------------


def _token_ids(tokens, vocab_size: int) -> Array:
    """The ids as an integer array, refusing any outside [0, V) (NumPy would wrap a
    negative id around to the end of W_E, or give a zero one-hot row)."""
    tokens = np.asarray(tokens)
    if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"token ids must be integers, got dtype {tokens.dtype}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got "
                         f"[{tokens.min()}, {tokens.max()}]")
    return tokens


def one_hot(tokens, vocab_size: int) -> Array:
    """X[t, v] = 1 if x_t = v else 0."""
    tokens = _token_ids(tokens, vocab_size)
    return (tokens[..., None] == np.arange(vocab_size)).astype(np.float64)


def token_embedding_one_hot(X, W_E) -> Array:
    """E = X W_E: the one-hot rows select rows of W_E by a matrix product."""
    return _f64(X) @ _f64(W_E)


def token_embedding(tokens, W_E) -> Array:
    """e_t = W_E[x_t]: the same map as row selection."""
    W_E = _f64(W_E)
    return W_E[_token_ids(tokens, W_E.shape[0])]


def positional_embedding(T: int, W_P) -> Array:
    """P = rows 0 … T−1 of W_P."""
    return _f64(W_P)[:T]


def input_representation(E, P) -> Array:
    """h_t⁽⁰⁾ = e_t + p_t (Blueprint sec. 2.1)."""
    return _f64(E) + _f64(P)


# --- linear maps and attention -----------------------------------------------------------


def linear(x, W, b=None) -> Array:
    """y = x W + b."""
    y = _f64(x) @ _f64(W)
    return y if b is None else y + _f64(b)


def qkv_projection(H, W_qkv, b_qkv=None) -> tuple[Array, Array, Array]:
    """Q = H W_Q + b_Q, K = H W_K + b_K, V = H W_V + b_V (Blueprint eq 2), all heads at once."""
    QKV = linear(H, W_qkv, b_qkv)
    d = QKV.shape[-1] // 3
    return QKV[..., :d], QKV[..., d : 2 * d], QKV[..., 2 * d :]


def split_heads(X, n_heads: int) -> Array:
    """(…, T, d) → (…, h, T, d_k): head i takes columns i·d_k … (i+1)·d_k − 1."""
    X = _f64(X)
    *lead, T, d = X.shape
    return X.reshape(*lead, T, n_heads, d // n_heads).swapaxes(-3, -2)


def merge_heads(X) -> Array:
    """Concat(head_1, …, head_h): (…, h, T, d_k) → (…, T, h·d_k)."""
    X = _f64(X)
    *lead, h, T, dk = X.shape
    return X.swapaxes(-3, -2).reshape(*lead, T, h * dk)


def causal_mask(T: int) -> Array:
    """M[i, j] = 0 if j ≤ i else −∞."""
    M = np.zeros((T, T))
    M[np.triu_indices(T, k=1)] = -np.inf
    return M


def softmax_shifted(z, c, axis: int = -1) -> Array:
    """exp(z − c) / Σ exp(z − c): equal to softmax(z) for every finite c."""
    e = np.exp(_f64(z) - c)
    return e / e.sum(axis=axis, keepdims=True)


def softmax(z, axis: int = -1) -> Array:
    """softmax(z)_i = exp(z_i) / Σ_j exp(z_j), evaluated through the shift identity with
    c = max z so that no exponential overflows."""
    z = _f64(z)
    c = np.max(z, axis=axis, keepdims=True)
    return softmax_shifted(z, c, axis=axis)


def attention_scores(Q, K, M) -> Array:
    """S = Q Kᵀ / √d_k + M."""
    Q, K = _f64(Q), _f64(K)
    return Q @ K.swapaxes(-1, -2) / math.sqrt(Q.shape[-1]) + _f64(M)


def attention_weights(Q, K, M) -> Array:
    """A = softmax(S), row by row."""
    return softmax(attention_scores(Q, K, M), axis=-1)


def scaled_dot_product_attention(Q, K, V, M) -> Array:
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V (Blueprint eq 3)."""
    return attention_weights(Q, K, M) @ _f64(V)


def _causal_heads(H, W_qkv, b_qkv, n_heads: int) -> Array:
    """head_i = Attention(H W_Q⁽ⁱ⁾, H W_K⁽ⁱ⁾, H W_V⁽ⁱ⁾) with the causal mask (Blueprint eq 5),
    all heads stacked: (…, h, T, d_k)."""
    Q, K, V = qkv_projection(H, W_qkv, b_qkv)
    M = causal_mask(_f64(H).shape[-2])
    return scaled_dot_product_attention(
        split_heads(Q, n_heads), split_heads(K, n_heads), split_heads(V, n_heads), M
    )


def multi_head_attention(H, W_qkv, b_qkv, W_O, b_O, n_heads: int) -> Array:
    """MultiHead(H) = Concat(head_1, …, head_h) W_O + b_O (Blueprint eqs 4–5)."""
    return linear(merge_heads(_causal_heads(H, W_qkv, b_qkv, n_heads)), W_O, b_O)


def multi_head_attention_head_sum(H, W_qkv, b_qkv, W_O, b_O, n_heads: int) -> Array:
    """Σ_i head_i W_O⁽ⁱ⁾ + b_O, with W_O⁽ⁱ⁾ the rows i·d_k … (i+1)·d_k − 1 of W_O: each
    head writes into the residual stream on its own (the Notes' view)."""
    heads = _causal_heads(H, W_qkv, b_qkv, n_heads)
    W_O = _f64(W_O)
    dk = W_O.shape[0] // n_heads
    out = sum(heads[..., i, :, :] @ W_O[i * dk : (i + 1) * dk] for i in range(n_heads))
    return out if b_O is None else out + _f64(b_O)


# --- normalisation and feed-forward ------------------------------------------------------


def layer_norm(x, gamma, beta, eps: float) -> Array:
    """LN(x) = γ ⊙ (x − μ) / √(σ² + ε) + β over the last axis, σ² the biased variance."""
    x = _f64(x)
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return _f64(gamma) * (x - mu) / np.sqrt(var + eps) + _f64(beta)


def relu(x) -> Array:
    """max(0, x)."""
    return np.maximum(_f64(x), 0.0)


def gelu(x) -> Array:
    """x Φ(x) = x · ½ (1 + erf(x / √2))."""
    # imported here: the trainer imports this package for its schedule and batches and
    # never evaluates erf; scipy.special costs it 0.35 s of start-up
    from scipy.special import erf

    x = _f64(x)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_tanh(x) -> Array:
    """½ x (1 + tanh(√(2/π) (x + 0.044715 x³)))."""
    x = _f64(x)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def ffn_relu(x, W_1, b_1, W_2, b_2) -> Array:
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (Blueprint eq 6)."""
    return linear(relu(linear(x, W_1, b_1)), W_2, b_2)


def ffn_gelu(x, W_1, b_1, W_2, b_2) -> Array:
    """FFN(x) = GELU(x W_1 + b_1) W_2 + b_2."""
    return linear(gelu(linear(x, W_1, b_1)), W_2, b_2)


def ffn_gelu_tanh(x, W_1, b_1, W_2, b_2) -> Array:
    """FFN(x) = GELU_tanh(x W_1 + b_1) W_2 + b_2 (GPT-2, GPT-3)."""
    return linear(gelu_tanh(linear(x, W_1, b_1)), W_2, b_2)


def ffn_guide_product(x, W_1, b_1, W_2, b_2) -> Array:
    """FFNN(x) = σ(x W_1 + b_1) ⊙ σ(x W_2 + b_2) with σ = ReLU (Guide sec. 4, literally)."""
    return relu(linear(x, W_1, b_1)) * relu(linear(x, W_2, b_2))


FFN = {"relu": ffn_relu, "gelu": ffn_gelu, "gelu_tanh": ffn_gelu_tanh,
       "guide_product": ffn_guide_product}


# --- blocks --------------------------------------------------------------------------------


def _attn(H, p: dict, config: GPTConfig) -> Array:
    return multi_head_attention(H, p["attn.w_qkv"], p.get("attn.b_qkv"), p["attn.w_o"],
                                p.get("attn.b_o"), config.n_heads)


def _ffn(H, p: dict, config: GPTConfig) -> Array:
    return FFN[config.ffn](H, p["ffn.w_1"], p.get("ffn.b_1"), p["ffn.w_2"], p.get("ffn.b_2"))


def _ln(H, p: dict, which: str, config: GPTConfig) -> Array:
    return layer_norm(H, p[f"{which}.weight"], p[f"{which}.bias"], config.ln_eps)


def block_pre_ln(H, p: dict, config: GPTConfig) -> Array:
    """H' = H + MultiHead(LN_1(H)); H_out = H' + FFN(LN_2(H')) (GPT-2, GPT-3).

    ``p`` holds one block's parameters, named without the ``blocks.{l}.`` prefix."""
    H = _f64(H)
    H1 = H + _attn(_ln(H, p, "ln_1", config), p, config)
    return H1 + _ffn(_ln(H1, p, "ln_2", config), p, config)


def block_post_ln(H, p: dict, config: GPTConfig) -> Array:
    """H' = LN_1(H + MultiHead(H)); H_out = LN_2(H' + FFN(H')) (Blueprint eqs 7–8)."""
    H = _f64(H)
    H1 = _ln(H + _attn(H, p, config), p, "ln_1", config)
    return _ln(H1 + _ffn(H1, p, config), p, "ln_2", config)


def block_guide(H, p: dict, config: GPTConfig) -> Array:
    """H⁽ˡ⁺¹⁾ = LN(FFNN(Attention(H⁽ˡ⁾)) + H⁽ˡ⁾) (Guide sec. 5): one residual, one LayerNorm."""
    H = _f64(H)
    return _ln(_ffn(_attn(H, p, config), p, config) + H, p, "ln_1", config)


BLOCK = {"pre": block_pre_ln, "post": block_post_ln, "guide": block_guide}


# --- output --------------------------------------------------------------------------------


def final_layer_norm(H, gamma, beta, eps: float) -> Array:
    """H_f = LN_f(H) after the last block (GPT-2, GPT-3)."""
    return layer_norm(H, gamma, beta, eps)


def unembed_tied(H, W_E) -> Array:
    """logits = H W_Eᵀ (Blueprint eq 9: the output map is the embedding, transposed)."""
    return _f64(H) @ _f64(W_E).T


def unembed_untied(H, W_U, b_U=None) -> Array:
    """logits = H W_U + b_U (the Guide's single output projection)."""
    return linear(H, W_U, b_U)


def next_token_distribution(logits) -> Array:
    """P(x_{t+1} = v | x_{≤t}) = softmax(logits_t)_v (Blueprint eq 9)."""
    return softmax(logits, axis=-1)


def sequence_log_probability(tokens, logits) -> Array:
    """log P(x_2 … x_T | x_1) = Σ_{t=2}^{T} log P(x_t | x_{<t}) (Blueprint eq 1, conditioned
    on the first token). Row t−1 of ``logits`` predicts x_t."""
    tokens = np.asarray(tokens)
    logits = _f64(logits)
    z = logits[..., :-1, :]
    log_p = z - np.max(z, axis=-1, keepdims=True)
    log_p = log_p - np.log(np.exp(log_p).sum(axis=-1, keepdims=True))
    nxt = tokens[..., 1:]
    return np.take_along_axis(log_p, nxt[..., None], axis=-1)[..., 0].sum(axis=-1)


# --- the whole model -------------------------------------------------------------------------


def block_parameters(params: dict, layer: int) -> dict:
    """One block's parameters, without the ``blocks.{layer}.`` prefix."""
    prefix = f"blocks.{layer}."
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def embed(tokens, params: dict, config: GPTConfig) -> Array:
    """H⁽⁰⁾ = W_E[x] + W_P[:T] (Blueprint sec. 2.1), or W_E[x] alone for a model without
    positional embedding (the Guide's z_i = E(x_i), sec. 2)."""
    E = token_embedding(tokens, params["wte"])
    if not config.positional_embedding:
        return E
    return input_representation(E, positional_embedding(np.shape(tokens)[-1], params["wpe"]))


def gpt_forward(tokens, params: dict, config: GPTConfig) -> Array:
    """logits = unembed(LN_f(block_L(… block_1(W_E[x] + W_P[:T])))): (…, T) → (…, T, V)."""
    tokens = np.asarray(tokens)
    T = tokens.shape[-1]
    if T > config.n_ctx:
        raise ValueError(f"sequence length {T} exceeds n_ctx={config.n_ctx}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= config.vocab_size):
        raise ValueError(f"token ids must lie in [0, {config.vocab_size}), got "
                         f"[{tokens.min()}, {tokens.max()}]")
    H = embed(tokens, params, config)
    for layer in range(config.n_layers):
        H = BLOCK[config.norm](H, block_parameters(params, layer), config)
    if config.final_norm:
        H = final_layer_norm(H, params["ln_f.weight"], params["ln_f.bias"], config.ln_eps)
    if config.tied_embeddings:
        return unembed_tied(H, params["wte"])
    return unembed_untied(H, params["w_u"], params.get("b_u"))
