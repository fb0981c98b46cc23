"""What the checks of the forward groups share. A differential check draws inputs
(adversarial flavours included, see strategies), rounds them to the backend's dtype, calls
the backend's operation of the reference function's name and compares with the reference
on the same rounded inputs: exactly for maps that do no arithmetic, within the derived
budget (budgets.py) for the rest, at small sizes and at real kernels' boundaries. The
model checks share their cases: the reference's logits and budget, cached per case.

Sizes: a quarter of the model configurations are big in one concern
(strategies.MODEL_CONCERNS): a context of a block-boundary length up to 1025, one or two
heads of a real width (64 to 128, or an odd one), or a vocabulary of 1025 to 65537 with
ids past 2¹⁶.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from gptspec import reference as ref
from gptspec.conformance import budgets as B
from gptspec.conformance.context import declared_support
from gptspec.conformance.protocol import NotApplicable
from gptspec.conformance.strategies import (
    BOUNDARY_LENGTHS,
    FLAVOURS,
    ParameterRecipe,
    arrays,
    lengths,
    shapes,
)
from gptspec.spec.config import PRESETS, GPTConfig

EXACT = "exact: the map does no arithmetic, so any rounding is a bug"


LINEAR = "λ·(√n·u·(|x||W| + |b|) ⊕ u|y|), n = d_in (+1 for the bias)"


SOFTMAX = ("λ·y·((4 + s(n))·u ⊕ u|z − max z|), n = row length, s(n) = max(√n, (n − 1)/λ) "
           "(a sum of n terms of one sign)")


# Row-wise maps are cheap at any size: they draw a boundary shape half the time.
ROW_WISE_SHARE = 1 / 2


def row_shapes(max_n: int = 40, boundary=BOUNDARY_LENGTHS):
    """(rows, n) for a map over rows of length n: 1–8 rows (independent of each other),
    n small or, half the time, at a boundary (where blocked and online kernels split a
    row)."""
    return st.tuples(st.integers(1, 8), lengths(max_n, ROW_WISE_SHARE, boundary=boundary))


def matrix_dims(max_t: int = 8, max_d: int = 24, rows=BOUNDARY_LENGTHS, cols=BOUNDARY_LENGTHS,
          share=None):
    """(T, d): each small, or one of them at a boundary."""
    return shapes((max_t, max_d), (rows, cols), share)


def draw_rounded(data, shape, ctx, flavours=FLAVOURS, scale=1.0, n=None, edge=None) -> np.ndarray:
    """An array of ``shape`` rounded to the backend's dtype (``n``: the inner length the
    "large" flavour leaves room for; ``edge``: the "overflow_edge" flavour's magnitude)."""
    x = data.draw(arrays(tuple(shape), ctx.precision.dtype, flavours, scale, n, edge),
                  label="array")
    return B.round_to(x, ctx.precision.dtype)


def check_against(ctx, name: str, args: tuple, expected, scale) -> None:
    # Precondition: the exact result is representable in the dtype (a result beyond its
    # largest value correctly overflows to ±∞, and there is nothing to compare).
    assume(B.representable(expected, ctx.precision.dtype))
    actual = ctx.op(name)(*args)
    ctx.record(name, B.compare(actual, expected, B.budget(scale)))


def check_exact(ctx, name: str, args: tuple, expected) -> None:
    ctx.record(name, B.exact(ctx.op(name)(*args), expected))


# Big model cases cost a big reference each: a quarter of the cases (7 or 8 at the
# default profile, spread over the three concerns).
MODEL_SHARE = 1 / 4


MODEL = "every stage's roundings propagated through the model (budgets.gpt_forward_bound)"


BLOCK_OPS = {"pre": "block_pre_ln", "post": "block_post_ln", "guide": "block_guide"}


def rounded_parameters(recipe, dtype: str) -> dict[str, np.ndarray]:
    return {k: B.round_to(v, dtype) for k, v in recipe.make().items()}


@functools.lru_cache(maxsize=4)
def _reference(config: GPTConfig, recipe: ParameterRecipe, dtype: str, shape: tuple[int, ...],
               ids: bytes) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    tokens = np.frombuffer(ids, dtype=np.int64).reshape(shape)
    params = rounded_parameters(recipe, dtype)
    return (params, ref.gpt_forward(tokens, params, config),
            B.gpt_forward_bound(tokens, params, config, B.Precision.of(dtype)))


def reference_case(config: GPTConfig, recipe: ParameterRecipe, tokens: np.ndarray,
                   dtype: str) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The parameters rounded to ``dtype``, the reference's logits and their error scale
    (budgets.gpt_forward_bound), cached: the model checks draw the same cases, and a big
    case's reference is the expensive part of its example. Callers must not modify the
    arrays. Sequences are independent, so row b of the logits and of the scale is also
    that of the sequence alone."""
    tokens = np.ascontiguousarray(tokens, dtype=np.int64)
    return _reference(config, recipe, dtype, tokens.shape, tokens.tobytes())


# GPT-2 small's shapes with one block: the blocks are alike, and one keeps the run's time
GPT2_SMALL = dataclasses.replace(PRESETS["gpt2"], n_layers=1)


GPT2_SCALE = 0.02  # GPT-2's initialisation


def require_supported(backend, config: GPTConfig) -> None:
    """For a check of one fixed configuration (no drawn examples for the context to
    skip): NotApplicable where the backend's ``supports`` declares it cannot express it."""
    supports = declared_support(backend)
    reason = supports(config) if supports is not None else None
    if reason:
        raise NotApplicable(str(reason))


def drawn_training_case(case, dtype: str, data):
    config, recipe, tokens = case
    params = {k: B.round_to(v, dtype) for k, v in recipe.make().items()}
    targets = np.asarray(data.draw(st.lists(st.integers(0, config.vocab_size - 1),
                                            min_size=tokens.size, max_size=tokens.size),
                                   label="targets")).reshape(tokens.shape)
    return config, params, tokens, targets
