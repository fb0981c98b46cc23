"""The output side and the whole model, transcribed literally in float64 NumPy (spec group
"output"): final LayerNorm, unembedding, the next-token distribution, gpt_forward.
"""

from __future__ import annotations

import numpy as np

from gptspec.reference.arrays import Array, f64
from gptspec.reference.attention import linear, softmax
from gptspec.reference.block import BLOCK, block_parameters, layer_norm
from gptspec.reference.embedding import embed
from gptspec.spec.config import GPTConfig

__all__ = [
    "final_layer_norm",
    "unembed_tied",
    "unembed_untied",
    "next_token_distribution",
    "sequence_log_probability",
    "gpt_forward",
]


def final_layer_norm(H, gamma, beta, eps: float) -> Array:
    """H_f = LN_f(H) after the last block (GPT-2, GPT-3)."""
    return layer_norm(H, gamma, beta, eps)


def unembed_tied(H, W_E) -> Array:
    """logits = H W_Eᵀ (Blueprint eq 9: the output map is the embedding, transposed)."""
    return f64(H) @ f64(W_E).T


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
    logits = f64(logits)
    z = logits[..., :-1, :]
    log_p = z - np.max(z, axis=-1, keepdims=True)
    log_p = log_p - np.log(np.exp(log_p).sum(axis=-1, keepdims=True))
    nxt = tokens[..., 1:]
    return np.take_along_axis(log_p, nxt[..., None], axis=-1)[..., 0].sum(axis=-1)




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
