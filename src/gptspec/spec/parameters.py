"""The canonical parameter schema: every backend's parameters, by name and shape.

Convention: row vectors. A linear map is x ↦ x W + b with W of shape (in, out), so
``blocks.{l}.attn.w_qkv`` holds [W_Q | W_K | W_V] side by side, each h·d_k wide, and head
i of W_Q is its columns i·d_k … (i+1)·d_k − 1 (the same layout as GPT-2's own files);
W_O is (h·d_k, d_model). h·d_k = d_model unless the head width is free.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gptspec.spec.config import GPTConfig


@dataclass(frozen=True)
class ParameterSpec:
    name: str
    shape: tuple[int, ...]
    symbol: str  # LaTeX symbol in the spec
    meaning: str
    init: str  # "normal", "residual_normal" (scaled by 1/sqrt(2L)), "zeros", "ones"


def parameter_schema(config: GPTConfig) -> list[ParameterSpec]:
    """Every parameter of a model of this configuration, in a fixed order."""
    c = config
    d, f, a = c.d_model, c.d_ff, c.d_attn
    specs = [
        ParameterSpec("wte", (c.vocab_size, d), "W_E", "token embedding, one row per token", "normal"),
    ]
    if c.positional_embedding:
        specs.append(ParameterSpec("wpe", (c.n_ctx, d), "W_P",
                                   "learned positional embedding, one row per position", "normal"))
    for layer in range(c.n_layers):
        p = f"blocks.{layer}."
        specs += [
            ParameterSpec(p + "ln_1.weight", (d,), r"\gamma_1", "first LayerNorm gain", "ones"),
            ParameterSpec(p + "ln_1.bias", (d,), r"\beta_1", "first LayerNorm bias", "zeros"),
            ParameterSpec(p + "attn.w_qkv", (d, 3 * a), r"[W_Q \mid W_K \mid W_V]",
                          "query, key and value maps of all heads, side by side", "normal"),
        ]
        if c.attn_bias:
            specs.append(ParameterSpec(p + "attn.b_qkv", (3 * a,), r"[b_Q \mid b_K \mid b_V]",
                                       "query, key and value biases", "zeros"))
        specs.append(ParameterSpec(p + "attn.w_o", (a, d), "W_O", "attention output map", "residual_normal"))
        if c.attn_bias:
            specs.append(ParameterSpec(p + "attn.b_o", (d,), "b_O", "attention output bias", "zeros"))
        if c.norm != "guide":  # the Guide's block has a single LayerNorm
            specs += [
                ParameterSpec(p + "ln_2.weight", (d,), r"\gamma_2", "second LayerNorm gain", "ones"),
                ParameterSpec(p + "ln_2.bias", (d,), r"\beta_2", "second LayerNorm bias", "zeros"),
            ]
        second_in = d if c.ffn == "guide_product" else f  # the Guide's W_2 also reads x
        specs.append(ParameterSpec(p + "ffn.w_1", (d, f), "W_1", "first FFN map", "normal"))
        if c.ffn_bias:
            specs.append(ParameterSpec(p + "ffn.b_1", (f,), "b_1", "first FFN bias", "zeros"))
        specs.append(ParameterSpec(p + "ffn.w_2", (second_in, d), "W_2", "second FFN map",
                                   "normal" if c.ffn == "guide_product" else "residual_normal"))
        if c.ffn_bias:
            specs.append(ParameterSpec(p + "ffn.b_2", (d,), "b_2", "second FFN bias", "zeros"))
    if c.final_norm:
        specs += [
            ParameterSpec("ln_f.weight", (d,), r"\gamma_f", "final LayerNorm gain", "ones"),
            ParameterSpec("ln_f.bias", (d,), r"\beta_f", "final LayerNorm bias", "zeros"),
        ]
    if not c.tied_embeddings:
        specs.append(ParameterSpec("w_u", (d, c.vocab_size), "W_U", "unembedding (untied)", "normal"))
        if c.output_bias:
            specs.append(ParameterSpec("b_u", (c.vocab_size,), "b_U", "unembedding bias", "zeros"))
    return specs


def parameter_count(config: GPTConfig) -> int:
    return sum(int(np.prod(s.shape)) for s in parameter_schema(config))


def init_parameters(config: GPTConfig, seed: int = 0, std: float = 0.02) -> dict[str, np.ndarray]:
    """GPT-2's initialisation, in float64: N(0, 0.02²), residual projections scaled by
    1/√(2L) (Radford et al. 2019, sec. 2.3), LayerNorm gains one, biases zero."""
    rng = np.random.default_rng(seed)
    params: dict[str, np.ndarray] = {}
    for s in parameter_schema(config):
        if s.init == "ones":
            params[s.name] = np.ones(s.shape)
        elif s.init == "zeros":
            params[s.name] = np.zeros(s.shape)
        else:
            scale = std / np.sqrt(2 * config.n_layers) if s.init == "residual_normal" else std
            params[s.name] = rng.normal(0.0, scale, size=s.shape)
    return params


class ParameterError(ValueError):
    """Parameters that do not match the schema; the message names the parameter."""


def check_parameters(params: dict[str, np.ndarray], config: GPTConfig) -> None:
    """Refuse parameters that are missing, unexpected, or of the wrong shape."""
    expected = {s.name: s.shape for s in parameter_schema(config)}
    for name, shape in expected.items():
        if name not in params:
            raise ParameterError(f"parameter {name!r} is missing")
        got = tuple(np.shape(params[name]))
        if got != shape:
            raise ParameterError(f"parameter {name!r} has shape {got}, expected {shape}")
    extra = sorted(set(params) - set(expected))
    if extra:
        raise ParameterError(f"unexpected parameter {extra[0]!r}")
