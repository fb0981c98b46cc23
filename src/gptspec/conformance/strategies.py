"""Hypothesis strategies for the suite: configurations, parameters, tokens and arrays.

Arrays are drawn as a *recipe* (flavour, scale, NumPy seed), not element by element: fast
at realistic sizes, and a falsifying example shrinks to a short recipe that reproduces it
exactly. Flavours are what a careless kernel gets wrong: ``normal``, ``large``,
``near_ties`` (repeated values nudged by ulps), ``tiny_variance`` (LayerNorm's hard case),
and, only for checks whose spec entry says what happens there (:data:`EDGE_FLAVOURS`),
``overflow_edge`` and ``underflow_edge`` (a dtype's largest and subnormal range).
:func:`sized` draws, with probability :data:`BIG_SHARE`, a size at real kernels' tile and
block boundaries (:data:`BOUNDARY_LENGTHS`, :data:`HEAD_WIDTHS`, :data:`VOCAB_SIZES`),
where toy shapes never reach; the choice shrinks to a small size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from gptspec.conformance import budgets
from gptspec.spec.config import GPTConfig
from gptspec.spec.parameters import parameter_schema

FLAVOURS = ("normal", "large", "near_ties", "tiny_variance")
EDGE_FLAVOURS = ("overflow_edge", "underflow_edge")


@dataclass(frozen=True)
class ArrayRecipe:
    """How an array was made; ``make`` rebuilds it exactly."""

    shape: tuple[int, ...]
    flavour: str
    scale: float
    seed: int

    def make(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        if self.flavour == "normal":
            return rng.normal(0.0, self.scale, self.shape)
        if self.flavour == "large":
            return rng.uniform(-self.scale, self.scale, self.shape)
        if self.flavour == "near_ties":
            values = rng.normal(0.0, self.scale, 3)
            picks = values[rng.integers(0, 3, self.shape)]
            return picks * (1 + 1e-6 * rng.integers(-3, 4, self.shape))
        if self.flavour == "tiny_variance":
            offset = rng.normal(0.0, self.scale, self.shape[:-1] + (1,))
            return offset + 1e-3 * np.abs(offset) * rng.normal(0.0, 1.0, self.shape)
        sign = rng.choice((-1.0, 1.0), self.shape)
        if self.flavour == "overflow_edge":
            return sign * rng.uniform(0.5, 1.0, self.shape) * self.scale
        if self.flavour == "underflow_edge":
            return sign * np.exp2(rng.uniform(-10.0, 2.0, self.shape)) * self.scale
        raise ValueError(f"unknown flavour {self.flavour!r}")


def large_scale(dtype: str, n: int | None = None) -> float:
    """A magnitude that is large for the dtype yet leaves the results of the check
    representable. Given n, the length of the check's inner products of two such entries
    (n = 1 for an elementwise sum): float16 (largest value 65504) gets √(65504 / 2n), so
    that n products and a bias of the same size stay finite, since the contract makes a
    16-bit backend accumulate in float32 and round once; the other dtypes have range to
    spare and get 10³. Without n, for inputs that pass through a model's stacked products
    (H W_Q, H W_K, then Q Kᵀ), float16 keeps 8."""
    if dtype != "float16":
        return 1e3
    if n is None:
        return 8.0
    return math.sqrt(budgets.LARGEST["float16"] / (2 * n))


def edge_scale(dtype: str, n: int = 2, power: int = 1) -> float:
    """The largest magnitude M the spec's contract asks an operation to handle without
    overflow (the softmax entry's range decision): every representable input, as long as
    the operation's internals (float32 for a 16-bit dtype, else the dtype itself) hold n
    terms of M^power. Softmax forms z − max z (n = 2, power = 1): float16 gets its largest
    value 65504, the others half of theirs. LayerNorm sums n squares of (x − μ), up to
    (2M)² each (n = 4·row length, power = 2)."""
    internals = "float32" if dtype in ("float16", "bfloat16") else dtype
    return min(budgets.LARGEST[dtype], (budgets.LARGEST[internals] / n) ** (1 / power))


@st.composite
def array_recipes(draw, shape: tuple[int, ...], dtype: str = "float64",
                  flavours: tuple[str, ...] = FLAVOURS, scale: float = 1.0,
                  n: int | None = None, edge: float | None = None) -> ArrayRecipe:
    """A recipe of ``shape``: ``n`` sets the "large" flavour's magnitude (large_scale),
    ``edge`` the "overflow_edge" flavour's (default edge_scale(dtype))."""
    flavour = draw(st.sampled_from(flavours))
    seed = draw(st.integers(0, 2**32 - 1))
    if flavour == "large":
        s = large_scale(dtype, n)
    elif flavour == "overflow_edge":
        s = edge_scale(dtype) if edge is None else edge
    elif flavour == "underflow_edge":
        s = budgets.TINY[dtype]
    else:
        s = scale * draw(st.sampled_from((1.0, 0.1, 3.0)))
    return ArrayRecipe(tuple(shape), flavour, float(s), seed)


def arrays(shape: tuple[int, ...], dtype: str = "float64", flavours: tuple[str, ...] = FLAVOURS,
           scale: float = 1.0, n: int | None = None,
           edge: float | None = None) -> st.SearchStrategy[np.ndarray]:
    return array_recipes(shape, dtype, flavours, scale, n, edge).map(lambda r: r.make())


# --- sizes that cross kernels' boundaries ------------------------------------------------

# Block and tile sizes of real kernels: attention tiles of 64 and 128 keys, 256-wide GEMM
# panels, online softmax over blocks of 1024.
KERNEL_BLOCKS = (64, 128, 256, 1024)
# one below, at, one above each
BOUNDARY_LENGTHS = tuple(b + k for b in KERNEL_BLOCKS for k in (-1, 0, 1))
# GPT-2's 64, the 80/96/128 of larger models, and two no kernel is tuned for
HEAD_WIDTHS = (64, 80, 96, 128, 72, 17)
# past 1024, GPT-2's 50257, around 2¹⁶ (ids that no longer fit 16 bits), and the 100277
# and 128256 of later tokenizers
VOCAB_SIZES = (1025, 50257, 65535, 65536, 65537, 100277, 128256)
# the probability of a size from a boundary set rather than a small one: with the default
# profile's 30 examples a check draws about 10 boundary sizes, each of the 4 block sizes
# two or three times; big shapes stay the minority, and thorough draws 70 to 90
BIG_SHARE = 1 / 3


def big(share: float | None = None) -> st.SearchStrategy[bool]:
    """True with probability ``share`` (None: BIG_SHARE); shrinks to False. BIG_SHARE is
    read when drawn, and 0 turns every boundary size off (toy sizes only, for tests)."""
    slots = 60

    def is_big(i: int) -> bool:
        if BIG_SHARE == 0:
            return False
        return i >= round(slots * (1 - (BIG_SHARE if share is None else share)))

    return st.integers(0, slots - 1).map(is_big)


def _spread_index(n: int) -> st.SearchStrategy[int]:
    """An index below n, spread evenly: a wide integer reduced mod n (Hypothesis draws
    small ranges, as sampled_from does, with a strong pull toward their first values and
    repeats them; the boundary values must each come up); shrinks to 0."""
    return st.integers(0, 2**16 - 1).map(lambda i: i % n)


@st.composite
def sized(draw, small: st.SearchStrategy[int], boundary: tuple[int, ...],
          share: float | None = None, label: str = "size") -> int:
    """A small size, or with probability ``share`` one of ``boundary``."""
    if draw(big(share), label=f"{label} at a boundary"):
        return boundary[draw(_spread_index(len(boundary)), label=label)]
    return draw(small, label=label)


def lengths(max_small: int = 8, share: float | None = None, min_size: int = 1,
            boundary: tuple[int, ...] = BOUNDARY_LENGTHS) -> st.SearchStrategy[int]:
    """A sequence length, key count or row length: 1 … max_small, or one of
    BOUNDARY_LENGTHS."""
    return sized(st.integers(min_size, max_small), boundary, share, "length")


def head_widths(max_small: int = 6, share: float | None = None) -> st.SearchStrategy[int]:
    """d_k: 1 … max_small, or one of HEAD_WIDTHS."""
    return sized(st.integers(1, max_small), HEAD_WIDTHS, share, "d_k")


def vocab_sizes(max_small: int = 30, share: float | None = None,
                min_size: int = 1) -> st.SearchStrategy[int]:
    """A vocabulary size: min_size … max_small, or one of VOCAB_SIZES."""
    return sized(st.integers(min_size, max_small), VOCAB_SIZES, share, "V")


@st.composite
def shapes(draw, small: tuple[int, ...], boundary: tuple[tuple[int, ...], ...],
           share: float | None = None, min_sizes: tuple[int, ...] | None = None
           ) -> tuple[int, ...]:
    """A shape whose axis i is min_sizes[i] … small[i], except, with probability
    ``share``, one axis drawn from ``boundary[i]``: the cost stays that of a small shape
    times one big size (for products whose every axis may be big)."""
    lows = min_sizes or (1,) * len(small)
    axis = draw(sized(st.just(-1), tuple(range(len(small))), share, "big axis"))
    return tuple(boundary[i][draw(_spread_index(len(boundary[i])), label=f"axis {i}")]
                 if i == axis
                 else draw(st.integers(lows[i], small[i]), label=f"axis {i}")
                 for i in range(len(small)))


@st.composite
def token_ids(draw, V: int, min_size: int = 1, max_size: int = 12) -> np.ndarray:
    """Token ids below V. In a large vocabulary, the top ids and those past 2¹⁶ (where a
    16-bit id wraps) are drawn as often as the rest."""
    n = draw(st.integers(min_size, max_size), label="number of ids")
    special = sorted(i for i in {V - 1, V - 2, 2**16 - 1, 2**16, 2**16 + 1, V // 2} if 0 <= i < V)
    ids = st.one_of(st.integers(0, V - 1), st.sampled_from(special))
    return np.array(draw(st.lists(ids, min_size=n, max_size=n), label="ids"), dtype=np.int64)


# What a big model case makes big, one concern at a time (so that its reference stays
# affordable): a context around a block size, heads of real widths, a real vocabulary.
MODEL_CONCERNS = ("context", "head_width", "vocabulary")


@st.composite
def configs(draw, max_layers: int = 2, max_heads: int = 3, max_d_head: int = 6,
            max_ctx: int = 8, max_vocab: int = 24, norms=("pre", "post", "guide"),
            ffns=("relu", "gelu", "gelu_tanh", "guide_product"),
            share: float | None = 0.0, concerns: tuple[str, ...] = MODEL_CONCERNS
            ) -> GPTConfig:
    """Configurations of every variant: small ones, and with probability ``share`` (None:
    BIG_SHARE) one that is big in one of MODEL_CONCERNS: n_ctx one of BOUNDARY_LENGTHS; or one or two
    heads of a width in HEAD_WIDTHS with n_ctx up to 129; or a vocabulary in VOCAB_SIZES.
    A quarter of the small ones have a free head width (h·d_k ≠ d_model in general, the
    Notes' d_k and GPT-3's XL and 13B rows), and a quarter no positional embedding (the
    Guide); attention and FFN biases are drawn apart (the Blueprint has only the FFN's)."""
    concern = None
    if share != 0 and draw(big(share), label="a big configuration"):
        concern = draw(st.sampled_from(concerns), label="big in")
    if concern == "head_width":
        n_heads = draw(st.integers(1, 2))
        d_model = n_heads * draw(st.sampled_from(HEAD_WIDTHS), label="d_k")
    else:
        n_heads = draw(st.integers(1, max_heads))
        d_model = n_heads * draw(st.integers(1, max_d_head))
    d_head = None  # d_model / h
    if concern != "head_width" and draw(st.sampled_from((False, False, False, True)),
                                        label="free head width"):
        d_head = draw(st.integers(1, max_d_head), label="d_head")
        d_model = draw(st.integers(1, max_heads * max_d_head), label="d_model")
    if concern == "context":
        n_ctx = draw(st.sampled_from(BOUNDARY_LENGTHS), label="n_ctx")
    elif concern == "head_width":
        n_ctx = draw(lengths(max_ctx, 1 / 2, boundary=BOUNDARY_LENGTHS[:6]), label="n_ctx")
    else:
        n_ctx = draw(st.integers(1, max_ctx))
    if concern == "vocabulary":
        vocab = draw(st.sampled_from(VOCAB_SIZES), label="vocab_size")
    else:
        vocab = draw(st.integers(2, max_vocab))
    ffn = draw(st.sampled_from(ffns))
    norm = draw(st.sampled_from(norms))
    tied = draw(st.booleans())
    return GPTConfig(
        vocab_size=vocab,
        n_ctx=n_ctx,
        d_model=d_model,
        n_layers=draw(st.integers(1, max_layers if concern is None else 1)),
        n_heads=n_heads,
        d_head=d_head,
        d_ff=d_model if ffn == "guide_product" else draw(st.integers(1, 4 * d_model)),
        norm=norm,
        ffn=ffn,
        tied_embeddings=tied,
        attn_bias=draw(st.booleans(), label="attn_bias"),
        ffn_bias=draw(st.booleans(), label="ffn_bias"),
        positional_embedding=draw(st.sampled_from((True, True, True, False)),
                                  label="positional_embedding"),
        output_bias=(not tied) and draw(st.booleans()),
        final_norm=draw(st.booleans()),
        ln_eps=draw(st.sampled_from((1e-5, 1e-6, 1e-3))),
    )


@dataclass(frozen=True)
class ParameterRecipe:
    config: GPTConfig
    scale: float
    seed: int

    def make(self) -> dict[str, np.ndarray]:
        """Random parameters of every shape in the schema; LayerNorm gains around one,
        biases non-zero, so that no term of the model is trivially absent."""
        rng = np.random.default_rng(self.seed)
        params = {}
        for s in parameter_schema(self.config):
            if s.init == "ones":
                params[s.name] = 1.0 + 0.2 * rng.normal(size=s.shape)
            elif s.init == "zeros":
                params[s.name] = 0.1 * rng.normal(size=s.shape)
            else:
                params[s.name] = rng.normal(0.0, self.scale, s.shape)
        return params


# Weight scales drawn for each dtype. With 16-bit storage, scores of weights at scale 0.3
# are rounded by several ulps of their exponent's argument and the model's logits lose all
# accuracy (the budget then exceeds the logits, and checks nothing); GPT-2's own
# initialisation scale keeps them meaningful.
PARAMETER_SCALES = {"float16": (0.02, 0.05), "bfloat16": (0.02, 0.05)}
DEFAULT_SCALES = (0.3, 0.02, 1.0)


@st.composite
def parameter_recipes(draw, config: GPTConfig, dtype: str = "float64") -> ParameterRecipe:
    scale = draw(st.sampled_from(PARAMETER_SCALES.get(dtype, DEFAULT_SCALES)))
    return ParameterRecipe(config, scale, draw(st.integers(0, 2**32 - 1)))


def sequence_lengths(n_ctx: int) -> st.SearchStrategy[int]:
    """T ≤ n_ctx: 1 … n_ctx for a small context; for one past 8 (a configuration drawn big
    for its context or head width), a boundary length it reaches, or n_ctx itself if it
    reaches none. Always long: a short T would waste the big draw, and what goes wrong
    only over many rows (a gradient summed over B·T rows or a token's repeats in 16 bits)
    showed in one default example in thirty when half of these were 1 … 8."""
    if n_ctx <= 8:
        return st.integers(1, n_ctx)
    reached = tuple(b for b in BOUNDARY_LENGTHS if b <= n_ctx) or (n_ctx,)
    return st.sampled_from(reached)


# Up to this many ids are drawn one by one (so that they shrink); more come from a seed.
DRAWN_IDS = 64


def text_like_ids(rng: np.random.Generator, vocab_size: int, n: int) -> np.ndarray:
    """n ids as skewed as a text's: Zipf's law, the commonest id (a random one) at about a
    quarter of the positions, hundreds of times in a long batch, where a backward pass
    that sums a repeated token's rows in 16 bits drifts."""
    ranks = (rng.zipf(1.3, n) - 1) % vocab_size
    return rng.permutation(vocab_size)[ranks]


@st.composite
def token_arrays(draw, config: GPTConfig, batch: int | None = None,
                 length: int | None = None) -> np.ndarray:
    """Tokens (B, T): B of 1–3, T ≤ n_ctx (at a block boundary where n_ctx reaches one).
    A long array is made from a seed: uniform ids, or half the time ids as skewed as a
    text's (Zipf), with the vocabulary's top ids and those past 2¹⁶ planted in it."""
    B = batch if batch is not None else draw(st.integers(1, 3))
    T = length if length is not None else draw(sequence_lengths(config.n_ctx))
    if B * T <= DRAWN_IDS:
        return draw(token_ids(config.vocab_size, B * T, B * T)).reshape(B, T)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="token seed"))
    if draw(st.booleans(), label="skewed like text"):
        ids = text_like_ids(rng, config.vocab_size, B * T)
    else:
        ids = rng.integers(0, config.vocab_size, B * T)
    special = draw(token_ids(config.vocab_size, 1, 8), label="planted ids")
    ids[rng.choice(B * T, special.size, replace=False)] = special
    return ids.reshape(B, T)


@st.composite
def model_cases(draw, dtype: str = "float64", **config_kwargs
                ) -> tuple[GPTConfig, ParameterRecipe, np.ndarray]:
    """A configuration, its parameters and a batch of tokens (``share`` passed to
    :func:`configs` makes some of them big)."""
    config = draw(configs(**config_kwargs))
    return config, draw(parameter_recipes(config, dtype)), draw(token_arrays(config))


@st.composite
def ragged_prompts(draw, config: GPTConfig, max_prompts: int = 4) -> list[list[int]]:
    """2 … max_prompts prompts, all shorter than n_ctx, of at least two different
    lengths (a ragged batch: padding, or per-sequence lengths, are needed to batch them)."""
    lengths = draw(st.lists(st.integers(1, config.n_ctx - 1), min_size=2, max_size=max_prompts)
                   .filter(lambda ls: len(set(ls)) > 1), label="lengths")
    token = st.integers(0, config.vocab_size - 1)
    return [draw(st.lists(token, min_size=n, max_size=n)) for n in lengths]
