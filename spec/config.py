"""The model configuration, its validation, and named presets.

Sizes follow the project's notation: V (vocab_size), n_ctx, d_model, L (n_layers),
h (n_heads), d_k = d_model / h, d_ff.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

NORMS = ("pre", "post", "guide")
FFNS = ("relu", "gelu", "gelu_tanh", "guide_product")


class ConfigError(ValueError):
    """A configuration that does not describe a model; the message names the field."""


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    n_ctx: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    norm: str = "pre"  # "pre" (GPT-2/3), "post" (Blueprint eqs 7-8), "guide" (Guide sec. 5)
    ffn: str = "gelu_tanh"  # "relu" (Blueprint eq 6), "gelu", "gelu_tanh" (GPT-2/3), "guide_product"
    tied_embeddings: bool = True  # Blueprint eq 9; False: the Guide's W, b
    bias: bool = True  # biases of the Q/K/V, output and FFN maps
    output_bias: bool = False  # a bias on the unembedding (untied only)
    final_norm: bool = True  # LayerNorm after the last block (GPT-2/3)
    ln_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_ctx", "d_model", "n_layers", "n_heads", "d_ff"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"config field {name!r} must be an integer, got {value!r}")
            if value <= 0:
                raise ConfigError(f"config field {name!r} must be positive, got {value}")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"config field 'n_heads' ({self.n_heads}) must divide 'd_model' ({self.d_model})"
            )
        if self.norm not in NORMS:
            raise ConfigError(f"config field 'norm' must be one of {NORMS}, got {self.norm!r}")
        if self.ffn not in FFNS:
            raise ConfigError(f"config field 'ffn' must be one of {FFNS}, got {self.ffn!r}")
        if self.ffn == "guide_product" and self.d_ff != self.d_model:
            raise ConfigError(
                "config field 'd_ff' must equal 'd_model' for ffn='guide_product' "
                f"(its product is added to the residual stream), got {self.d_ff} != {self.d_model}"
            )
        if self.tied_embeddings and self.output_bias:
            raise ConfigError("config field 'output_bias' needs tied_embeddings=False")
        for name in ("tied_embeddings", "bias", "output_bias", "final_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"config field {name!r} must be true or false")
        if (isinstance(self.ln_eps, bool) or not isinstance(self.ln_eps, (int, float))
                or not 0 < self.ln_eps < float("inf")):
            raise ConfigError(f"config field 'ln_eps' must be a positive number, got {self.ln_eps!r}")

    @property
    def d_head(self) -> int:
        """d_k = d_v = d_model / h."""
        return self.d_model // self.n_heads

    def replace(self, **changes: Any) -> GPTConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GPTConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config field {unknown[0]!r}")
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.name not in data and f.default is dataclasses.MISSING]
        if missing:
            raise ConfigError(f"config field {missing[0]!r} is missing")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> GPTConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"config is not valid JSON: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError("config JSON must be an object")
        return cls.from_dict(data)


def _gpt2(d_model: int, n_layers: int, n_heads: int) -> GPTConfig:
    return GPTConfig(vocab_size=50257, n_ctx=1024, d_model=d_model, n_layers=n_layers,
                     n_heads=n_heads, d_ff=4 * d_model)


PRESETS: dict[str, GPTConfig] = {
    # GPT-2 (Radford et al. 2019): pre-LN, tanh GELU, tied embeddings, biases everywhere.
    "gpt2": _gpt2(768, 12, 12),
    "gpt2-medium": _gpt2(1024, 24, 16),
    "gpt2-large": _gpt2(1280, 36, 20),
    "gpt2-xl": _gpt2(1600, 48, 25),
    # The Blueprint fixes the structure, not the sizes; sizes are Vaswani et al.'s base model.
    "blueprint": GPTConfig(vocab_size=50257, n_ctx=512, d_model=512, n_layers=6, n_heads=8,
                           d_ff=2048, norm="post", ffn="relu", tied_embeddings=True,
                           final_norm=False),
    # The Guide: one residual per block, its product FFN, an untied output map with bias.
    "guide": GPTConfig(vocab_size=50257, n_ctx=512, d_model=512, n_layers=6, n_heads=8,
                       d_ff=512, norm="guide", ffn="guide_product", tied_embeddings=False,
                       output_bias=True, final_norm=False),
    # Small models for tests and for CPU training.
    "tiny": GPTConfig(vocab_size=64, n_ctx=16, d_model=32, n_layers=2, n_heads=4, d_ff=128),
    "tiny-post": GPTConfig(vocab_size=64, n_ctx=16, d_model=32, n_layers=2, n_heads=4, d_ff=128,
                           norm="post", ffn="relu", final_norm=False),
    "tiny-guide": GPTConfig(vocab_size=64, n_ctx=16, d_model=32, n_layers=2, n_heads=4,
                            d_ff=32, norm="guide", ffn="guide_product",
                            tied_embeddings=False, output_bias=True, final_norm=False),
    # nanoGPT's shakespeare_char-on-CPU shapes, over a byte vocabulary.
    "shakespeare-char": GPTConfig(vocab_size=256, n_ctx=64, d_model=128, n_layers=4, n_heads=4,
                                  d_ff=512),
}


def preset(name: str) -> GPTConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
