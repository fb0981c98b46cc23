"""The backward pass, written out by hand in float64 NumPy: no autograd.

Each function is the backward equation of one forward operation (spec group
"gradients") and carries its spec entry's id as its name. Every function takes the
upstream gradient first (``dY``: ∂L/∂ of the forward output, same shape) followed by the
forward inputs, recomputes what it needs of the forward pass, and returns ∂L/∂ of each
input. Leading (batch) axes of a parameter's gradient are summed, since a parameter is
shared by every row.
"""

from __future__ import annotations

import math

import numpy as np

from gptspec.reference import attention, block, embedding, output
from gptspec.reference.arrays import Array, f64
from gptspec.reference.loss import cross_entropy_gradient, cross_entropy_mean
from gptspec.spec.config import GPTConfig
from gptspec.spec.parameters import parameter_schema

__all__ = [
    "linear_backward",
    "token_embedding_backward",
    "positional_embedding_backward",
    "input_representation_backward",
    "tied_embedding_accumulation",
    "unembed_tied_backward",
    "unembed_untied_backward",
    "layer_norm_backward",
    "softmax_backward",
    "scaled_dot_product_attention_backward",
    "multi_head_attention_backward",
    "relu_backward",
    "gelu_backward",
    "gelu_tanh_backward",
    "ffn_relu_backward",
    "ffn_gelu_backward",
    "ffn_gelu_tanh_backward",
    "ffn_guide_product_backward",
    "residual_backward",
    "block_pre_ln_backward",
    "block_post_ln_backward",
    "block_guide_backward",
    "gpt_backward",
]


def _rows(x) -> Array:
    """Every leading axis flattened into rows: (…, n) → (N, n)."""
    x = f64(x)
    return x.reshape(-1, x.shape[-1])


# --- linear maps and embeddings --------------------------------------------------------------


def linear_backward(dY, x, W) -> tuple[Array, Array, Array]:
    """y = x W + b  ⇒  ∂L/∂x = ∂L/∂y Wᵀ,  ∂L/∂W = Σ_rows xᵀ ∂L/∂y,  ∂L/∂b = Σ_rows ∂L/∂y."""
    dY = f64(dY)
    dx = dY @ f64(W).T
    dW = _rows(x).T @ _rows(dY)
    db = _rows(dY).sum(axis=0)
    return dx, dW, db


def token_embedding_backward(dE, tokens, vocab_size: int) -> Array:
    """E = X W_E  ⇒  ∂L/∂W_E = Xᵀ ∂L/∂E: row v collects the gradients of every position
    holding token v (a scatter-add; a token seen twice gets both)."""
    dE = f64(dE)
    dW = np.zeros((vocab_size, dE.shape[-1]))
    np.add.at(dW, np.asarray(tokens).reshape(-1), _rows(dE))
    return dW


def positional_embedding_backward(dP, n_ctx: int) -> Array:
    """P = W_P[:T]  ⇒  ∂L/∂W_P[t] = Σ_batch ∂L/∂P[t] for t < T, zero for the unused rows."""
    dP = f64(dP)
    T, d = dP.shape[-2], dP.shape[-1]
    dW = np.zeros((n_ctx, d))
    dW[:T] = dP.reshape(-1, T, d).sum(axis=0)
    return dW


def input_representation_backward(dH) -> tuple[Array, Array]:
    """H⁽⁰⁾ = E + P  ⇒  ∂L/∂E = ∂L/∂H⁽⁰⁾ and ∂L/∂P = ∂L/∂H⁽⁰⁾ (a sum copies its gradient)."""
    dH = f64(dH)
    return dH, dH


def tied_embedding_accumulation(dW_embed, dW_unembed) -> Array:
    """With W_U = W_Eᵀ (Blueprint eq 9) W_E is used twice, so its gradient is the sum of
    both uses: ∂L/∂W_E = Xᵀ ∂L/∂E + (∂L/∂Z)ᵀ H_f."""
    return f64(dW_embed) + f64(dW_unembed)


def unembed_tied_backward(dZ, H, W_E) -> tuple[Array, Array]:
    """Z = H W_Eᵀ  ⇒  ∂L/∂H = ∂L/∂Z W_E,  ∂L/∂W_E (this use) = Σ_rows (∂L/∂Z)ᵀ H."""
    dZ = f64(dZ)
    return dZ @ f64(W_E), _rows(dZ).T @ _rows(H)


def unembed_untied_backward(dZ, H, W_U) -> tuple[Array, Array, Array]:
    """Z = H W_U + b_U: a linear map (see linear_backward)."""
    return linear_backward(dZ, H, W_U)


# --- normalisation, softmax, attention ----------------------------------------------------------


def layer_norm_backward(dY, x, gamma, eps: float) -> tuple[Array, Array, Array]:
    """y = γ ⊙ x̂ + β, x̂ = (x − μ)/σ, σ = √(var + ε), over the last axis (n entries):
    ∂L/∂γ = Σ_rows ∂L/∂y ⊙ x̂,  ∂L/∂β = Σ_rows ∂L/∂y,
    ∂L/∂x = (g − mean(g) − x̂ mean(g ⊙ x̂)) / σ  with g = ∂L/∂y ⊙ γ."""
    dY, x = f64(dY), f64(x)
    mu = x.mean(axis=-1, keepdims=True)
    sigma = np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
    xhat = (x - mu) / sigma
    g = dY * f64(gamma)
    dx = (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True)) / sigma
    return dx, _rows(dY * xhat).sum(axis=0), _rows(dY).sum(axis=0)


def softmax_backward(dA, A) -> Array:
    """a = softmax(z)  ⇒  ∂L/∂z = a ⊙ (∂L/∂a − Σ_j a_j ∂L/∂a_j) (the Jacobian diag(a) − a aᵀ)."""
    dA, A = f64(dA), f64(A)
    return A * (dA - (dA * A).sum(axis=-1, keepdims=True))


def scaled_dot_product_attention_backward(dO, Q, K, V, M) -> tuple[Array, Array, Array]:
    """O = A V, A = softmax(S), S = Q Kᵀ/√d_k + M:
    ∂L/∂V = Aᵀ ∂L/∂O,  ∂L/∂A = ∂L/∂O Vᵀ,  ∂L/∂S = softmax_backward,
    ∂L/∂Q = ∂L/∂S K/√d_k,  ∂L/∂K = (∂L/∂S)ᵀ Q/√d_k.  Masked entries have a = 0, so
    no gradient reaches them."""
    dO, Q, K, V = f64(dO), f64(Q), f64(K), f64(V)
    A = attention.attention_weights(Q, K, M)
    dV = A.swapaxes(-1, -2) @ dO
    dS = softmax_backward(dO @ V.swapaxes(-1, -2), A)
    scale = 1.0 / math.sqrt(Q.shape[-1])
    return dS @ K * scale, dS.swapaxes(-1, -2) @ Q * scale, dV


def multi_head_attention_backward(dY, H, W_qkv, b_qkv, W_O, b_O, n_heads: int):
    """MultiHead(H) = Concat(heads) W_O + b_O, heads from Q, K, V = H W_qkv + b_qkv:
    the linear, attention and linear backward equations in reverse order.
    Returns (∂L/∂H, ∂L/∂W_qkv, ∂L/∂b_qkv, ∂L/∂W_O, ∂L/∂b_O)."""
    H = f64(H)
    Q, K, V = attention.qkv_projection(H, W_qkv, b_qkv)
    Qh, Kh, Vh = (attention.split_heads(X, n_heads) for X in (Q, K, V))
    M = attention.causal_mask(H.shape[-2])
    C = attention.merge_heads(attention.scaled_dot_product_attention(Qh, Kh, Vh, M))
    dC, dW_O, db_O = linear_backward(dY, C, W_O)
    dQh, dKh, dVh = scaled_dot_product_attention_backward(attention.split_heads(dC, n_heads), Qh, Kh, Vh, M)
    dQKV = np.concatenate([attention.merge_heads(d) for d in (dQh, dKh, dVh)], axis=-1)
    dH, dW_qkv, db_qkv = linear_backward(dQKV, H, W_qkv)
    return dH, dW_qkv, db_qkv, dW_O, db_O


# --- activations and feed-forward ------------------------------------------------------------------


def relu_backward(dY, x) -> Array:
    """d/dx max(0, x) = 1 for x > 0, else 0 (0 at x = 0, as every framework takes it)."""
    return f64(dY) * (f64(x) > 0)


def gelu_backward(dY, x) -> Array:
    """d/dx x Φ(x) = Φ(x) + x φ(x)."""
    from scipy.special import erf  # here, not at the top (see block.gelu)

    x = f64(x)
    cdf = 0.5 * (1.0 + erf(x / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * x**2) / math.sqrt(2.0 * math.pi)
    return f64(dY) * (cdf + x * pdf)


def gelu_tanh_backward(dY, x) -> Array:
    """y = ½ x (1 + tanh u), u = c (x + a x³)  ⇒
    dy/dx = ½ (1 + tanh u) + ½ x (1 − tanh² u) c (1 + 3 a x²), c = √(2/π), a = 0.044715."""
    x = f64(x)
    c, a = math.sqrt(2.0 / math.pi), 0.044715
    t = np.tanh(c * (x + a * x**3))
    return f64(dY) * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t**2) * c * (1.0 + 3.0 * a * x**2))


def _ffn_two_layer_backward(activation, activation_backward, dY, x, W_1, b_1, W_2):
    pre = attention.linear(x, W_1, b_1)
    dhidden, dW_2, db_2 = linear_backward(dY, activation(pre), W_2)
    dx, dW_1, db_1 = linear_backward(activation_backward(dhidden, pre), x, W_1)
    return dx, dW_1, db_1, dW_2, db_2


def ffn_relu_backward(dY, x, W_1, b_1, W_2, b_2=None):
    """FFN(x) = ReLU(x W_1 + b_1) W_2 + b_2: returns (∂x, ∂W_1, ∂b_1, ∂W_2, ∂b_2)."""
    return _ffn_two_layer_backward(block.relu, relu_backward, dY, x, W_1, b_1, W_2)


def ffn_gelu_backward(dY, x, W_1, b_1, W_2, b_2=None):
    """FFN(x) = GELU(x W_1 + b_1) W_2 + b_2: returns (∂x, ∂W_1, ∂b_1, ∂W_2, ∂b_2)."""
    return _ffn_two_layer_backward(block.gelu, gelu_backward, dY, x, W_1, b_1, W_2)


def ffn_gelu_tanh_backward(dY, x, W_1, b_1, W_2, b_2=None):
    """FFN(x) = GELU_tanh(x W_1 + b_1) W_2 + b_2: returns (∂x, ∂W_1, ∂b_1, ∂W_2, ∂b_2)."""
    return _ffn_two_layer_backward(block.gelu_tanh, gelu_tanh_backward, dY, x, W_1, b_1, W_2)


def ffn_guide_product_backward(dY, x, W_1, b_1, W_2, b_2):
    """y = ReLU(a) ⊙ ReLU(c), a = x W_1 + b_1, c = x W_2 + b_2  ⇒
    ∂L/∂a = ∂L/∂y ⊙ ReLU(c) ⊙ 1[a > 0],  ∂L/∂c = ∂L/∂y ⊙ ReLU(a) ⊙ 1[c > 0],
    and x receives from both maps: ∂L/∂x = ∂L/∂a W_1ᵀ + ∂L/∂c W_2ᵀ."""
    dY = f64(dY)
    a, c = attention.linear(x, W_1, b_1), attention.linear(x, W_2, b_2)
    dx_1, dW_1, db_1 = linear_backward(relu_backward(dY * block.relu(c), a), x, W_1)
    dx_2, dW_2, db_2 = linear_backward(relu_backward(dY * block.relu(a), c), x, W_2)
    return dx_1 + dx_2, dW_1, db_1, dW_2, db_2


FFN_BACKWARD = {"relu": ffn_relu_backward, "gelu": ffn_gelu_backward,
                "gelu_tanh": ffn_gelu_tanh_backward, "guide_product": ffn_guide_product_backward}


# --- blocks -------------------------------------------------------------------------------------------


def residual_backward(dY, dx_through_branch) -> Array:
    """y = x + f(x)  ⇒  ∂L/∂x = ∂L/∂y + J_fᵀ ∂L/∂y: the skip path copies the gradient, the
    branch adds its own (``dx_through_branch`` = J_fᵀ ∂L/∂y)."""
    return f64(dY) + f64(dx_through_branch)


def _attn_backward(dY, H, p: dict, config: GPTConfig, grads: dict) -> Array:
    dH, dW_qkv, db_qkv, dW_O, db_O = multi_head_attention_backward(
        dY, H, p["attn.w_qkv"], p.get("attn.b_qkv"), p["attn.w_o"], p.get("attn.b_o"),
        config.n_heads)
    grads["attn.w_qkv"], grads["attn.w_o"] = dW_qkv, dW_O
    if "attn.b_qkv" in p:
        grads["attn.b_qkv"], grads["attn.b_o"] = db_qkv, db_O
    return dH


def _ffn_backward(dY, H, p: dict, config: GPTConfig, grads: dict) -> Array:
    dH, dW_1, db_1, dW_2, db_2 = FFN_BACKWARD[config.ffn](
        dY, H, p["ffn.w_1"], p.get("ffn.b_1"), p["ffn.w_2"], p.get("ffn.b_2"))
    grads["ffn.w_1"], grads["ffn.w_2"] = dW_1, dW_2
    if "ffn.b_1" in p:
        grads["ffn.b_1"], grads["ffn.b_2"] = db_1, db_2
    return dH


def _ln_backward(dY, H, p: dict, which: str, config: GPTConfig, grads: dict) -> Array:
    dH, dgamma, dbeta = layer_norm_backward(dY, H, p[f"{which}.weight"], config.ln_eps)
    grads[f"{which}.weight"], grads[f"{which}.bias"] = dgamma, dbeta
    return dH


def block_pre_ln_backward(dY, H, p: dict, config: GPTConfig) -> tuple[Array, dict]:
    """H' = H + MultiHead(LN_1(H)), H_out = H' + FFN(LN_2(H')), backwards: each residual
    copies the gradient past its branch and adds the branch's. Returns (∂L/∂H, the
    block's parameter gradients named without the ``blocks.{l}.`` prefix)."""
    H = f64(H)
    g: dict = {}
    H1 = H + block._attn(block._ln(H, p, "ln_1", config), p, config)
    dffn = _ffn_backward(dY, block._ln(H1, p, "ln_2", config), p, config, g)
    dH1 = residual_backward(dY, _ln_backward(dffn, H1, p, "ln_2", config, g))
    dattn = _attn_backward(dH1, block._ln(H, p, "ln_1", config), p, config, g)
    return residual_backward(dH1, _ln_backward(dattn, H, p, "ln_1", config, g)), g


def block_post_ln_backward(dY, H, p: dict, config: GPTConfig) -> tuple[Array, dict]:
    """H' = LN_1(H + MultiHead(H)), H_out = LN_2(H' + FFN(H')), backwards: through each
    LayerNorm first, then the residual sum."""
    H = f64(H)
    g: dict = {}
    S1 = H + block._attn(H, p, config)
    H1 = block._ln(S1, p, "ln_1", config)
    S2 = H1 + block._ffn(H1, p, config)
    dS2 = _ln_backward(dY, S2, p, "ln_2", config, g)
    dH1 = residual_backward(dS2, _ffn_backward(dS2, H1, p, config, g))
    dS1 = _ln_backward(dH1, S1, p, "ln_1", config, g)
    return residual_backward(dS1, _attn_backward(dS1, H, p, config, g)), g


def block_guide_backward(dY, H, p: dict, config: GPTConfig) -> tuple[Array, dict]:
    """H_out = LN(FFNN(Attention(H)) + H) (Guide sec. 5), backwards: the LayerNorm, then the
    one residual whose branch is the FFN after the attention."""
    H = f64(H)
    g: dict = {}
    A = block._attn(H, p, config)
    S = block._ffn(A, p, config) + H
    dS = _ln_backward(dY, S, p, "ln_1", config, g)
    dA = _ffn_backward(dS, A, p, config, g)
    return residual_backward(dS, _attn_backward(dA, H, p, config, g)), g


BLOCK_BACKWARD = {"pre": block_pre_ln_backward, "post": block_post_ln_backward,
                  "guide": block_guide_backward}


# --- the whole model -------------------------------------------------------------------------------------


def gpt_backward(tokens, targets, params: dict, config: GPTConfig) -> tuple[float, dict]:
    """The per-token mean cross-entropy of the model on (tokens → targets) and its gradient
    with respect to every parameter, by schema name: the forward pass, then every
    backward equation in reverse order."""
    tokens, targets = np.asarray(tokens), np.asarray(targets)
    if targets.shape != tokens.shape:
        raise ValueError(f"targets of shape {targets.shape} do not match tokens {tokens.shape}")
    T = tokens.shape[-1]
    if T > config.n_ctx:
        raise ValueError(f"sequence length {T} exceeds n_ctx={config.n_ctx}")
    for name, ids in (("token ids", tokens), ("targets", targets)):
        if ids.size and (ids.min() < 0 or ids.max() >= config.vocab_size):
            raise ValueError(f"{name} must lie in [0, {config.vocab_size}), got "
                             f"[{ids.min()}, {ids.max()}]")
    block_inputs = []
    H = embedding.embed(tokens, params, config)
    for layer in range(config.n_layers):
        block_inputs.append(H)
        H = block.BLOCK[config.norm](H, block.block_parameters(params, layer), config)
    H_last = H
    if config.final_norm:
        H = output.final_layer_norm(H, params["ln_f.weight"], params["ln_f.bias"], config.ln_eps)
    if config.tied_embeddings:
        logits = output.unembed_tied(H, params["wte"])
    else:
        logits = output.unembed_untied(H, params["w_u"], params.get("b_u"))
    loss = cross_entropy_mean(logits, targets)

    grads: dict = {}
    dZ = cross_entropy_gradient(logits, targets, reduction="mean")
    if config.tied_embeddings:
        dH, dW_unembed = unembed_tied_backward(dZ, H, params["wte"])
    else:
        dH, grads["w_u"], db_u = unembed_untied_backward(dZ, H, params["w_u"])
        if config.output_bias:
            grads["b_u"] = db_u
    if config.final_norm:
        dH, grads["ln_f.weight"], grads["ln_f.bias"] = layer_norm_backward(
            dH, H_last, params["ln_f.weight"], config.ln_eps)
    for layer in reversed(range(config.n_layers)):
        dH, block_grads = BLOCK_BACKWARD[config.norm](
            dH, block_inputs[layer], block.block_parameters(params, layer), config)
        grads.update({f"blocks.{layer}.{k}": v for k, v in block_grads.items()})
    dE, dP = input_representation_backward(dH)
    dW_embed = token_embedding_backward(dE, tokens, config.vocab_size)
    grads["wte"] = (tied_embedding_accumulation(dW_embed, dW_unembed)
                    if config.tied_embeddings else dW_embed)
    if config.positional_embedding:
        grads["wpe"] = positional_embedding_backward(dP, config.n_ctx)
    return loss, {s.name: grads[s.name] for s in parameter_schema(config)}
