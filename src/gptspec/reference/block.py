"""The transformer block, transcribed literally in float64 NumPy: LayerNorm, the
activations and feed-forward networks, and the three residual forms (spec group "block").

``p`` holds one block's parameters, named without the ``blocks.{l}.`` prefix.
"""

from __future__ import annotations

import math

import numpy as np

from gptspec.reference.arrays import Array, f64
from gptspec.reference.attention import linear, multi_head_attention
from gptspec.spec.config import GPTConfig

__all__ = [
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
]


def layer_norm(x, gamma, beta, eps: float) -> Array:
    """LN(x) = γ ⊙ (x − μ) / √(σ² + ε) + β over the last axis, σ² the biased variance."""
    x = f64(x)
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return f64(gamma) * (x - mu) / np.sqrt(var + eps) + f64(beta)


def relu(x) -> Array:
    """max(0, x)."""
    return np.maximum(f64(x), 0.0)


def gelu(x) -> Array:
    """x Φ(x) = x · ½ (1 + erf(x / √2))."""
    # imported here: the trainer imports this package for its schedule and batches and
    # never evaluates erf; scipy.special costs it 0.35 s of start-up
    from scipy.special import erf

    x = f64(x)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_tanh(x) -> Array:
    """½ x (1 + tanh(√(2/π) (x + 0.044715 x³)))."""
    x = f64(x)
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
    H = f64(H)
    H1 = H + _attn(_ln(H, p, "ln_1", config), p, config)
    return H1 + _ffn(_ln(H1, p, "ln_2", config), p, config)


def block_post_ln(H, p: dict, config: GPTConfig) -> Array:
    """H' = LN_1(H + MultiHead(H)); H_out = LN_2(H' + FFN(H')) (Blueprint eqs 7–8)."""
    H = f64(H)
    H1 = _ln(H + _attn(H, p, config), p, "ln_1", config)
    return _ln(H1 + _ffn(H1, p, config), p, "ln_2", config)


def block_guide(H, p: dict, config: GPTConfig) -> Array:
    """H⁽ˡ⁺¹⁾ = LN(FFNN(Attention(H⁽ˡ⁾)) + H⁽ˡ⁾) (Guide sec. 5): one residual, one LayerNorm."""
    H = f64(H)
    return _ln(_ffn(_attn(H, p, config), p, config) + H, p, "ln_1", config)


BLOCK = {"pre": block_pre_ln, "post": block_post_ln, "guide": block_guide}




def block_parameters(params: dict, layer: int) -> dict:
    """One block's parameters, without the ``blocks.{layer}.`` prefix."""
    prefix = f"blocks.{layer}."
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}
