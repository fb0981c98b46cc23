"""The model configuration, its validation, and named presets.

Sizes follow the project's notation: V (vocab_size), n_ctx, d_model, L (n_layers),
h (n_heads), d_k = d_H (d_head; d_model / h unless given), d_ff.

Each document's model is a preset written as that document writes it; where a document
leaves a size or a switch open, or writes something a preset cannot take literally, the
choice is a ``Decision`` in ``PRESET_DECISIONS``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

from gptspec.spec.equation import Decision, Reading
from gptspec.spec.sources import BLUEPRINT, BROWN_2020, GUIDE, NOTES, RADFORD_2019, Source

NORMS = ("pre", "post", "guide")
FFNS = ("relu", "gelu", "gelu_tanh", "guide_product")


class ConfigError(ValueError):
    """A configuration that does not describe a model; the message names the field."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:  # json.loads would keep the last silently: which one was meant?
            raise ValueError(f"the key {key!r} is given twice")
        data[key] = value
    return data


def _no_constant(name: str) -> Any:
    # Python's json reads (and writes) NaN and ±Infinity, which JSON has no words for: a
    # file holding them was not written by a JSON writer, and a NaN read would pass every
    # range check below it
    raise ValueError(f"not valid JSON ({name} is not a JSON number)")


def _int(digits: str) -> int:
    # Python refuses to read more than 4300 digits, with advice meant for programmers
    n = len(digits.lstrip("-"))
    if n > 4300:
        raise ValueError(f"a number of {n} digits (no number gptspec reads has so many)")
    return int(digits)


def _float(text: str) -> float:
    value = float(text)  # 1e400 reads as inf: a NaN or infinity by another name
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is beyond a float's range")
    return value


def parse_json(text: str | bytes) -> Any:
    """``json.loads`` for the files gptspec reads (configs, state.json, tokenizers): a key
    given twice, NaN or ±Infinity (not JSON, though Python's json accepts them) and
    nesting deeper than Python's parser can follow, a number beyond a float's range (1e400)
    or of more than 4300 digits are ValueErrors with a one-line message (the caller names
    the file), like any other syntax error."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant,
                          parse_int=_int, parse_float=_float)
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON ({err.msg} at line {err.lineno}, column "
                         f"{err.colno})") from None
    except RecursionError:
        raise ValueError("not valid JSON: nested too deeply") from None


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int  # V, the number of token ids (0 … V − 1)
    n_ctx: int  # the longest context, in tokens (positions 0 … n_ctx − 1)
    d_model: int  # d, the width of the residual stream
    n_layers: int  # L, the number of blocks
    n_heads: int  # h, the number of attention heads
    d_ff: int  # the FFN's hidden width
    d_head: int | None = None  # d_k, each head's width; None: d_model / n_heads (must divide)
    norm: str = "pre"  # "pre" (GPT-2/3), "post" (Blueprint eqs 7-8), "guide" (Guide sec. 5)
    ffn: str = "gelu_tanh"  # "relu" (Blueprint eq 6), "gelu", "gelu_tanh" (GPT-2/3), "guide_product"
    tied_embeddings: bool = True  # Blueprint eq 9; False: the Guide's W, b
    attn_bias: bool = True  # b_Q, b_K, b_V and b_O (GPT-2/3); the Blueprint's eqs 2, 4 have none
    ffn_bias: bool = True  # b_1, b_2 of the FFN (every document)
    positional_embedding: bool = True  # learned W_P (Blueprint sec. 2.1); the Guide has none
    output_bias: bool = False  # a bias on the unembedding (untied only)
    final_norm: bool = True  # LayerNorm after the last block (GPT-2/3)
    ln_eps: float = 1e-5  # LayerNorm's ε, added to the variance inside the root

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_ctx", "d_model", "n_layers", "n_heads", "d_ff"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"config field {name!r} must be an integer, got {value!r}")
            if value <= 0:
                raise ConfigError(f"config field {name!r} must be positive, got {value}")
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ConfigError(
                    f"config field 'n_heads' ({self.n_heads}) must divide 'd_model' "
                    f"({self.d_model}), or 'd_head' must be given"
                )
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        elif (not isinstance(self.d_head, int) or isinstance(self.d_head, bool)
              or self.d_head <= 0):
            raise ConfigError(f"config field 'd_head' must be a positive integer, got {self.d_head!r}")
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
        for name in ("tied_embeddings", "attn_bias", "ffn_bias", "positional_embedding",
                     "output_bias", "final_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"config field {name!r} must be true or false")
        if (isinstance(self.ln_eps, bool) or not isinstance(self.ln_eps, (int, float))
                or not 0 < self.ln_eps < float("inf")):
            raise ConfigError(f"config field 'ln_eps' must be a positive number, got {self.ln_eps!r}")

    @property
    def d_attn(self) -> int:
        """h·d_k: the width of Q, K, V and of W_O's input (d_model unless d_k is free)."""
        assert self.d_head is not None  # resolved in __post_init__
        return self.n_heads * self.d_head

    @property
    def head_width_is_derived(self) -> bool:
        """Whether d_k = d_model / h (the default), so that h·d_k = d_model."""
        return self.d_attn == self.d_model

    def replace(self, **changes: Any) -> GPTConfig:
        """A copy with some fields changed. A derived head width follows new d_model and
        n_heads (d_head = d_model / h again); a free one stays unless given."""
        if "bias" in changes:  # the old single switch: both kinds of bias at once
            both = changes.pop("bias")
            if not isinstance(both, bool):
                raise ConfigError(f"config field 'bias' must be true or false, got {both!r}")
            changes.setdefault("attn_bias", both)
            changes.setdefault("ffn_bias", both)
        if ("d_model" in changes or "n_heads" in changes) and "d_head" not in changes \
                and self.head_width_is_derived:
            changes["d_head"] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields; d_head is null where it is derived (d_model / h), so that an edited
        d_model or n_heads in a written config derives it again."""
        data = dataclasses.asdict(self)
        if self.head_width_is_derived:
            data["d_head"] = None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GPTConfig:
        if "bias" in data:  # written before attention and FFN biases had their own switches
            data = dict(data)
            legacy = data.pop("bias")
            if not isinstance(legacy, bool):
                raise ConfigError(f"config field 'bias' must be true or false, got {legacy!r}")
            if "attn_bias" in data or "ffn_bias" in data:
                raise ConfigError("config field 'bias' (old) cannot be given with "
                                  "'attn_bias' or 'ffn_bias'")
            data["attn_bias"] = data["ffn_bias"] = legacy
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
        try:  # an untrusted file's, in a checkpoint's metadata
            data = parse_json(text)
        except ValueError as err:
            raise ConfigError(f"config: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError("config JSON must be an object")
        return cls.from_dict(data)


def _gpt2(d_model: int, n_layers: int, n_heads: int) -> GPTConfig:
    return GPTConfig(vocab_size=50257, n_ctx=1024, d_model=d_model, n_layers=n_layers,
                     n_heads=n_heads, d_ff=4 * d_model)


def _gpt3(n_layers: int, d_model: int, n_heads: int, d_head: int) -> GPTConfig:
    """A row of GPT-3's Table 2.1 (n_layers, d_model, n_heads, d_head as printed), with
    its n_ctx = 2048, d_ff = 4·d_model and GPT-2's vocabulary and block."""
    return GPTConfig(vocab_size=50257, n_ctx=2048, d_model=d_model, n_layers=n_layers,
                     n_heads=n_heads, d_ff=4 * d_model, d_head=d_head)


# GPT-3's Table 2.1 (Brown et al. 2020): name → (preset, the table's parameter count).
GPT3_TABLE: dict[str, tuple[GPTConfig, int]] = {
    "gpt3-small": (_gpt3(12, 768, 12, 64), 125_000_000),
    "gpt3-medium": (_gpt3(24, 1024, 16, 64), 350_000_000),
    "gpt3-large": (_gpt3(24, 1536, 16, 96), 760_000_000),
    "gpt3-xl": (_gpt3(24, 2048, 24, 128), 1_300_000_000),
    "gpt3-2.7b": (_gpt3(32, 2560, 32, 80), 2_700_000_000),
    "gpt3-6.7b": (_gpt3(32, 4096, 32, 128), 6_700_000_000),
    "gpt3-13b": (_gpt3(40, 5140, 40, 128), 13_000_000_000),
    "gpt3-175b": (_gpt3(96, 12288, 96, 128), 175_000_000_000),
}


PRESETS: dict[str, GPTConfig] = {
    # GPT-2 (Radford et al. 2019): pre-LN, tanh GELU, tied embeddings, biases everywhere.
    "gpt2": _gpt2(768, 12, 12),
    "gpt2-medium": _gpt2(1024, 24, 16),
    "gpt2-large": _gpt2(1280, 36, 20),
    "gpt2-xl": _gpt2(1600, 48, 25),
    # GPT-3, every size of Table 2.1, dense attention in every layer (see PRESET_DECISIONS).
    **{name: config for name, (config, _) in GPT3_TABLE.items()},
    # The Blueprint as written: W_e + p_i (sec. 2.1), no biases in Q, K, V (eq 2) or W_O
    # (eq 4), b_1 and b_2 in the ReLU FFN (eq 6), post-LN (eqs 7-8), tied output (eq 9).
    # It fixes the structure, not the sizes; sizes are Vaswani et al.'s base model.
    "blueprint": GPTConfig(vocab_size=50257, n_ctx=512, d_model=512, n_layers=6, n_heads=8,
                           d_ff=2048, norm="post", ffn="relu", tied_embeddings=True,
                           attn_bias=False, ffn_bias=True, final_norm=False),
    # The Guide as written: z_i = E(x_i) with no positional term (sec. 2), attention with
    # no bias (sec. 3), its product FFN with b_1, b_2 (sec. 4), one residual per block
    # (sec. 5), an untied output map with bias (sec. 6).
    "guide": GPTConfig(vocab_size=50257, n_ctx=512, d_model=512, n_layers=6, n_heads=8,
                       d_ff=512, norm="guide", ffn="guide_product", tied_embeddings=False,
                       output_bias=True, final_norm=False, attn_bias=False,
                       positional_embedding=False),
    # The Guide with GPT's learned positions added (the project's earlier reading; why it
    # is kept: PRESET_DECISIONS["guide"]).
    "guide-positional": GPTConfig(vocab_size=50257, n_ctx=512, d_model=512, n_layers=6,
                                  n_heads=8, d_ff=512, norm="guide", ffn="guide_product",
                                  tied_embeddings=False, output_bias=True, final_norm=False,
                                  attn_bias=False),
    # The Notes' GPT-3-style model with the head width d_k free: h·d_k = 384 ≠ d_model.
    "notes": GPTConfig(vocab_size=50257, n_ctx=2048, d_model=512, n_layers=6, n_heads=6,
                       d_ff=2048, d_head=64),
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


# Where a preset cannot simply copy its document: every reading, and what the preset uses.
PRESET_DECISIONS: dict[str, Decision] = {
    "blueprint": Decision(
        question="Which maps of the Blueprint's model carry a bias?",
        readings=(
            Reading(Source(BLUEPRINT, "eq 2"), "Q = H W_Q, K = H W_K, V = H W_V: no bias"),
            Reading(Source(BLUEPRINT, "eq 4"), "Concat(head_1, …, head_h) W_O: no bias"),
            Reading(Source(BLUEPRINT, "eq 6"), "max(0, x W_1 + b_1) W_2 + b_2: both FFN biases"),
            Reading(Source(RADFORD_2019, "sec. 2.3"), "GPT-2: a bias on every linear map"),
        ),
        decision="attn_bias = false, ffn_bias = true: the Blueprint's equations as written.",
        why="Each document's model is reproduced as written; GPT-2's attention biases are "
            "its own presets' (attn_bias = true).",
    ),
    "guide": Decision(
        question="Does the Guide's model have a positional embedding?",
        readings=(
            Reading(Source(GUIDE, "sec. 2"), "z_i = E(x_i): the token's embedding alone"),
            Reading(Source(BLUEPRINT, "sec. 2.1"), "h_i = e_{x_i} + p_i, p_i learned"),
        ),
        decision="The `guide` preset has none (positional_embedding = false; no `wpe` in its "
                 "schema); `guide-positional` is the same model with GPT's learned W_P added.",
        why="`guide` is the Guide as written. Without W_P its only cue to order is the causal "
            "mask (a token sees how many came before it only through the attention average), "
            "which is why every GPT adds positions; `guide-positional` keeps the project's "
            "earlier reading, that sec. 2's z_i = E(x_i) abbreviates the usual sum, for "
            "training runs that want the Guide's block with positions.",
    ),
    "notes": Decision(
        question="Is the head width d_k (the Notes' d_H) tied to d_model?",
        readings=(
            Reading(Source(NOTES, "sec. 3.1"), "d_H is a parameter of its own (the attention "
                    "head dimension), with W_O mapping the h concatenated heads back to d"),
            Reading(Source(BLUEPRINT, "eq 2"), "W_Q ∈ R^{d_model × d_k}, d_k not fixed further"),
            Reading(Source(RADFORD_2019, "sec. 2.3"), "GPT-2: d_k = d_model / h"),
        ),
        decision="d_k is a configuration field, d_head (default d_model / h); W_qkv is "
                 "(d_model, 3·h·d_k), W_O is (h·d_k, d_model). The `notes` preset takes "
                 "h = 6, d_k = 64 with d_model = 512 (h·d_k = 384), other sizes GPT-3's.",
        why="The Notes treat d_H as free, and GPT-3's own table needs it (XL, 13B). The Notes "
            "fix no sizes; ours are small and chosen so that h does not divide d_model.",
    ),
    "gpt3-table": Decision(
        question="Two rows of GPT-3's Table 2.1 do not satisfy h·d_k = d_model: XL "
                 "(24 × 128 = 3072 ≠ 2048) and 13B (40 × 128 = 5120 ≠ 5140). What do "
                 "their presets use?",
        readings=(
            Reading(Source(BROWN_2020, "Table 2.1"), "XL: d_model 2048, 24 heads, d_head 128, "
                    "1.3B parameters; 13B: d_model 5140, 40 heads, d_head 128, 13.0B"),
            Reading(Source(NOTES, "sec. 3.1"), "d_H is free; W_O maps h·d_H back to d_model"),
        ),
        decision="The table's columns as printed, with d_head free: gpt3-xl has h·d_k = 3072, "
                 "gpt3-13b has h·d_k = 5120.",
        why="With a free head width every printed column is expressible, so no column has to "
            "be corrected by guesswork. The cost is visible in the parameter-count table: "
            "gpt3-13b lands within 0.5% of 13.0B either way, while gpt3-xl counts about "
            "1.52B, not 1.3B; the published 1.3B matches an attention width of 2048 (e.g. "
            "16 heads × 128), so one of the XL row's head columns is probably a misprint, "
            "but the table does not say which.",
    ),
    "gpt3-attention": Decision(
        question="GPT-3 alternates dense and locally banded sparse attention between layers; "
                 "what do the gpt3-* presets compute?",
        readings=(
            Reading(Source(BROWN_2020, "sec. 2.1"), "alternating dense and locally banded "
                    "sparse attention patterns in the layers, as in the Sparse Transformer"),
            Reading(Source(NOTES, "sec. 3.1"), "dense causal attention in every layer"),
        ),
        decision="Dense causal attention in every layer: the gpt3-* presets have GPT-3's "
                 "sizes and parameter counts, not its sparse layers' attention pattern.",
        why="The spec defines dense attention only; the band's width and layout are not "
            "given in the paper, so a banded layer could not be specified from it. Banded "
            "attention has no parameters of its own, so the parameter counts are unaffected.",
    ),
}


def preset(name: str) -> GPTConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
