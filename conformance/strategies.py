"""Hypothesis strategies for the suite: configurations, parameters, tokens and arrays.

Arrays are drawn as a *recipe* (a flavour, a scale and a NumPy seed) rather than element
by element: the examples stay fast to generate at realistic sizes, and a falsifying
example shrinks to a short, readable recipe that reproduces it exactly.

Flavours (the adversarial ones are what a careless kernel gets wrong):

* ``normal``: N(0, scale²) entries;
* ``large``: entries up to a large magnitude (see :func:`large_scale`);
* ``near_ties``: a few distinct values repeated, each copy nudged by a few ulps;
* ``tiny_variance``: a common offset plus noise 10⁻³ of it, row by row (LayerNorm's
  hard case: the mean dominates the spread).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from gptspec.spec.config import GPTConfig
from gptspec.spec.parameters import parameter_schema

FLAVOURS = ("normal", "large", "near_ties", "tiny_variance")


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
        raise ValueError(f"unknown flavour {self.flavour!r}")


def large_scale(dtype: str) -> float:
    """A magnitude that is large for the dtype yet leaves headroom for the sums of a few
    dozen products (float16 overflows at 65504: attention scores are products of two
    such sums)."""
    return {"float16": 8.0, "bfloat16": 1e3, "float32": 1e3, "float64": 1e3}.get(dtype, 1e3)


@st.composite
def array_recipes(draw, shape: tuple[int, ...], dtype: str = "float64",
                  flavours: tuple[str, ...] = FLAVOURS, scale: float = 1.0) -> ArrayRecipe:
    flavour = draw(st.sampled_from(flavours))
    seed = draw(st.integers(0, 2**32 - 1))
    s = large_scale(dtype) if flavour == "large" else scale * draw(st.sampled_from((1.0, 0.1, 3.0)))
    return ArrayRecipe(tuple(shape), flavour, float(s), seed)


def arrays(shape: tuple[int, ...], dtype: str = "float64", flavours: tuple[str, ...] = FLAVOURS,
           scale: float = 1.0) -> st.SearchStrategy[np.ndarray]:
    return array_recipes(shape, dtype, flavours, scale).map(lambda r: r.make())


@st.composite
def configs(draw, max_layers: int = 2, max_heads: int = 3, max_d_head: int = 6,
            max_ctx: int = 8, max_vocab: int = 24, norms=("pre", "post", "guide"),
            ffns=("relu", "gelu", "gelu_tanh", "guide_product")) -> GPTConfig:
    """Small configurations of every variant."""
    n_heads = draw(st.integers(1, max_heads))
    d_model = n_heads * draw(st.integers(1, max_d_head))
    ffn = draw(st.sampled_from(ffns))
    norm = draw(st.sampled_from(norms))
    tied = draw(st.booleans())
    return GPTConfig(
        vocab_size=draw(st.integers(2, max_vocab)),
        n_ctx=draw(st.integers(1, max_ctx)),
        d_model=d_model,
        n_layers=draw(st.integers(1, max_layers)),
        n_heads=n_heads,
        d_ff=d_model if ffn == "guide_product" else draw(st.integers(1, 4 * d_model)),
        norm=norm,
        ffn=ffn,
        tied_embeddings=tied,
        bias=draw(st.booleans()),
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


@st.composite
def token_arrays(draw, config: GPTConfig, batch: int | None = None,
                 length: int | None = None) -> np.ndarray:
    B = batch if batch is not None else draw(st.integers(1, 3))
    T = length if length is not None else draw(st.integers(1, config.n_ctx))
    ids = draw(st.lists(st.integers(0, config.vocab_size - 1), min_size=B * T, max_size=B * T))
    return np.array(ids, dtype=np.int64).reshape(B, T)


@st.composite
def model_cases(draw, dtype: str = "float64", **config_kwargs
                ) -> tuple[GPTConfig, ParameterRecipe, np.ndarray]:
    """A configuration, its parameters and a batch of tokens."""
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
