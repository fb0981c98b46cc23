"""Reference: costs — the size and cost formulas of spec/costs.py in exact Python integers.

Each function is named after its spec entry and takes a GPTConfig; the FLOP and memory
conventions are those stated in gptspec.spec.costs.
"""

from __future__ import annotations

from gptspec.spec.config import GPTConfig

__all__ = [
    "param_count_token_embedding",
    "param_count_positional_embedding",
    "param_count_attention",
    "param_count_ffn",
    "param_count_block_norms",
    "param_count_block",
    "param_count_final_norm",
    "param_count_unembedding",
    "param_count_total",
    "matmul_weights_per_token",
    "forward_flops_per_token",
    "training_flops_per_token",
    "kv_cache_bytes",
    "activation_memory_bytes",
]


def param_count_token_embedding(config: GPTConfig) -> int:
    """W_E: V × d_model."""
    return config.vocab_size * config.d_model


def param_count_positional_embedding(config: GPTConfig) -> int:
    """W_P: n_ctx × d_model; none without a positional embedding (the Guide)."""
    return config.n_ctx * config.d_model if config.positional_embedding else 0


def param_count_attention(config: GPTConfig) -> int:
    """[W_Q | W_K | W_V] (d × 3a), W_O (a × d), and their biases (3a, d), a = h·d_k."""
    d, a = config.d_model, config.d_attn
    return d * 3 * a + a * d + (3 * a + d if config.attn_bias else 0)


def param_count_ffn(config: GPTConfig) -> int:
    """W_1 (d × d_ff), W_2 (d_ff × d, or d × d for the Guide's product), and biases."""
    d, f = config.d_model, config.d_ff
    w_2_rows = d if config.ffn == "guide_product" else f
    return d * f + w_2_rows * d + (f + d if config.ffn_bias else 0)


def param_count_block_norms(config: GPTConfig) -> int:
    """γ and β of each of the block's LayerNorms (one in the Guide's block, else two)."""
    norms = 1 if config.norm == "guide" else 2
    return norms * 2 * config.d_model


def param_count_block(config: GPTConfig) -> int:
    return (param_count_attention(config) + param_count_ffn(config)
            + param_count_block_norms(config))


def param_count_final_norm(config: GPTConfig) -> int:
    return 2 * config.d_model if config.final_norm else 0


def param_count_unembedding(config: GPTConfig) -> int:
    """Nothing when tied (the output map is W_Eᵀ); W_U (d × V) and b_U (V) otherwise."""
    if config.tied_embeddings:
        return 0
    V = config.vocab_size
    return config.d_model * V + (V if config.output_bias else 0)


def param_count_total(config: GPTConfig) -> int:
    return (param_count_token_embedding(config) + param_count_positional_embedding(config)
            + config.n_layers * param_count_block(config) + param_count_final_norm(config)
            + param_count_unembedding(config))


def matmul_weights_per_token(config: GPTConfig) -> int:
    """Q, K, V, O (4 d·h·d_k), W_1 and W_2 in each block, and the unembedding d·V."""
    d, f, a = config.d_model, config.d_ff, config.d_attn
    w_2_rows = d if config.ffn == "guide_product" else f
    return config.n_layers * (4 * d * a + d * f + w_2_rows * d) + d * config.vocab_size


def forward_flops_per_token(config: GPTConfig) -> int:
    """2 FLOPs per weight met, plus Q Kᵀ and A V over a causal window of n_ctx."""
    return (2 * matmul_weights_per_token(config)
            + 2 * config.n_layers * config.n_ctx * config.d_attn)


def training_flops_per_token(config: GPTConfig) -> int:
    """Forward plus a backward pass of twice its cost."""
    return 3 * forward_flops_per_token(config)


def kv_cache_bytes(config: GPTConfig, batch: int = 1, bytes_per_element: int = 2) -> int:
    """K and V, each (B, h, n_ctx, d_k), in every layer."""
    per_layer = 2 * batch * config.n_ctx * config.d_attn
    return config.n_layers * per_layer * bytes_per_element


def activation_memory_bytes(config: GPTConfig, batch: int = 1, seq_len: int | None = None,
                            bytes_per_element: int = 2) -> int:
    """The tensors a training step keeps for its backward pass, under the assumptions of
    the spec entry (no recomputation, no dropout, attention weights materialised)."""
    T = config.n_ctx if seq_len is None else seq_len
    d, f, h, a = config.d_model, config.d_ff, config.n_heads, config.d_attn
    norms = 1 if config.norm == "guide" else 2
    attention = T * d + 3 * T * a + h * T * T + T * a  # input, Q K V, weights, merged heads
    ffn = T * d + 2 * T * f  # input and the two hidden tensors
    per_block = attention + ffn + norms * T * d  # plus each LayerNorm's input
    head = (2 * T * d if config.final_norm else T * d) + T * config.vocab_size
    return batch * bytes_per_element * (config.n_layers * per_block + head)
