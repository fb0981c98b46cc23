"""Error budgets derived from the dtype's unit roundoff and each reduction's length.

Inputs are rounded to the backend's dtype before it and the float64 reference see them,
so a budget covers only the rounding inside the computation. Roundings are taken as
independent and mean-zero (Higham & Mary 2019): a length-n sum accumulated with unit
roundoff u_acc errs on the scale √n·u_acc·Σ|terms|, each stored result adds u·|y|, an
elementwise function a few roundings, and input errors propagate to first order through
the derivative, independent contributions in quadrature. A budget is λ (``LAMBDA``)
times that scale. Each ``*_bound`` mirrors the reference function of its name and returns
(value, error scale). 16-bit backends must accumulate in float32: u_acc = 2⁻²⁴ for sums
and inside LayerNorm, softmax and the activations, their own u for stored results.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
from scipy.special import erf

import gptspec.reference as ref
from gptspec.reference.block import block_parameters
from gptspec.spec.config import GPTConfig

Array = np.ndarray

UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
}

# Smallest positive normal number: below it a dtype loses relative precision.
TINY = {
    "float64": 2.0**-1022,
    "float32": 2.0**-126,
    "float16": 2.0**-14,
    "bfloat16": 2.0**-126,
}

# The absolute error a stored result may have besides u·|y| (Precision.tiny): where an
# engine flushes results below TINY to zero (XLA does for float32; GPUs' fast-math modes
# for float32 and bfloat16) the error is up to TINY itself, a negligible 10⁻³⁸ for those
# formats. float16 keeps its subnormals in PyTorch, NumPy, ONNX Runtime and XLA (each
# checked on the CPU: 3·10⁻⁴ × 10⁻³ gives 2.98·10⁻⁷, five grid steps), so one rounding
# below TINY errs by at most 2⁻²⁵; its floor stays TINY (2⁻¹⁴) all the same, because the
# budgets treat roundings in different rows as independent, and below TINY they are not:
# a softmax tail over a big vocabulary gives nearly the same ∂L/∂z in every row, a few
# grid steps each, so every row rounds it the same way, and a gradient summed over the
# rows (∂b, ∂W, ∂γ) gathers R times one row's error where the quadrature allows √R. With
# 2⁻²⁴ as the floor the soundness gate failed a correct backend (vocabulary 128256, 24
# rows, d_model 4: 210% on ∂b_1). The price of TINY is that float16 gradients of a
# long batch (∂L/∂z about 5·10⁻⁷) are barely checked: budgets of the order of the
# gradients themselves. Tightening it needs the floor carried apart from the other
# errors, as an error shared by the rows.
ABSOLUTE_FLOOR = {
    "float64": 2.0**-1022,
    "float32": 2.0**-126,
    "float16": 2.0**-14,
    "bfloat16": 2.0**-126,
}

LARGEST = {
    "float64": float(np.finfo(np.float64).max),
    "float32": float(np.finfo(np.float32).max),
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
}

# The format a dtype's sums and products accumulate in (the attention_scores entry's
# decision; Precision.u_acc is its unit roundoff): float32 for the 16-bit formats.
ACCUMULATION = {"float64": "float64", "float32": "float32", "float16": "float32",
                "bfloat16": "float32"}

# Roundings inside one evaluation of an elementwise function, counted from the formula
# each backend is expected to use (library exp/tanh/erf are within 1-2 ulps).
ROUNDINGS = {
    "relu": 0,
    "gelu": 6,  # x/√2, erf, 1+, ·x, ·½
    "gelu_tanh": 10,  # x³, ·c, +x, ·√(2/π), tanh, 1+, ·x, ·½
    "exp": 2,
    "softmax_normalise": 2,  # the division, and the exponential's own rounding
}


@dataclass(frozen=True)
class Precision:
    """The unit roundoffs of a backend's dtype: u for stored results, u_acc for sums."""

    dtype: str
    u: float
    u_acc: float
    tiny: float

    @classmethod
    def of(cls, dtype: str) -> Precision:
        name = str(dtype).replace("torch.", "")
        if name not in UNIT_ROUNDOFF:
            raise ValueError(f"no unit roundoff known for dtype {dtype!r}")
        u = UNIT_ROUNDOFF[name]
        u_acc = min(u, UNIT_ROUNDOFF["float32"])
        return cls(name, u, u_acc, ABSOLUTE_FLOOR[name])

    @overload
    def sum_scale(self, n: int) -> float: ...
    @overload
    def sum_scale(self, n: Array) -> Array: ...
    def sum_scale(self, n):
        """√n·u_acc: the error scale of a length-n sum, relative to Σ|terms| (n: one length,
        or one per row: see ``terms`` in softmax_bound)."""
        return np.sqrt(n) * self.u_acc

    @overload
    def same_sign_sum_scale(self, n: int) -> float: ...
    @overload
    def same_sign_sum_scale(self, n: Array) -> Array: ...
    def same_sign_sum_scale(self, n):
        """The error scale of a length-n sum of terms of one sign (softmax's normaliser,
        LayerNorm's mean and variance): where the terms are nearly equal, a sequential sum
        rounds the same way at every step, so its errors are not mean-zero as Higham &
        Mary's model assumes; only the worst case (n − 1)·u_acc·Σ|terms| bounds it. As a
        scale (the budget multiplies by λ): max(√n, (n − 1)/λ)·u_acc."""
        return np.maximum(np.sqrt(n), (np.asarray(n) - 1) / LAMBDA) * self.u_acc

    def inner_product_scale(self, n: int | Array, abs_terms: Array, total: Array) -> Array:
        """The error scale of a length-n inner product whose Σ|terms| is ``abs_terms`` and
        whose value is ``total``: √n·u_acc·Σ|terms| for terms of mixed signs, and, for the
        part of the terms that shares one sign (A V with a one-signed column of V: the
        weights are all positive), a sequential sum's drift, up to (n − 1)·u_acc·|Σ terms|
        as for same_sign_sum_scale (a scale: divided by λ). Found by the soundness gate: a
        float32 sum over 949 keys, one term at a time, was 121% of the √n budget alone."""
        drift = np.maximum(np.asarray(n) - 1, 0) / LAMBDA * self.u_acc * np.abs(total)
        return _q(self.sum_scale(n) * abs_terms, drift)

    def subnormal(self, y: Array, ey: Array) -> Array:
        """1 where y lies below TINY and was rounded there (its error scale is not 0): an
        element whose rounding may share its sign with its neighbours'."""
        return ((np.abs(y) < TINY[self.dtype]) & (np.asarray(ey) > 0)).astype(np.float64)

    @property
    def floor_drift(self) -> float:
        """A sum's coherent error per subnormal term, as a scale (over λ): values below
        TINY round onto an evenly spaced grid, of spacing 2·u·TINY (float16 keeps its
        subnormals in every engine checked; see ABSOLUTE_FLOOR), and values of one size
        (a softmax's tail over 1025 tokens, divided by 2048 positions) all land at the
        same place between two grid points, so their errors, up to half the spacing each,
        share a sign: a sum of n of them errs by up to n·u·TINY, where a quadrature of
        independent roundings allows √n of them. Seen in float16: the tied ∂W_E of a
        mean over 2048 positions, whose ∂L/∂z is about 5·10⁻⁷ (8 grid steps), 134% of
        a budget that had only the quadrature (and the grid's spacing as its floor)."""
        return self.u * TINY[self.dtype] / LAMBDA

    def store(self, y: Array) -> Array:
        """The rounding of a stored result: u·|y| plus the absolute floor below the
        smallest normal number (ABSOLUTE_FLOOR)."""
        return self.u * np.abs(y) + self.tiny


LAMBDA = 6.0
# below this the floor's drift cannot reach a budget's size (float32's and bfloat16's
# 2⁻¹²⁶ times any length): not computed
FLOOR_WORTH_A_TERM = 1e-30


def budget(scale: Array) -> Array:
    """The budget for a result whose propagated error scale is ``scale``."""
    return LAMBDA * np.asarray(scale)


def _q(*terms) -> Array:
    """Independent error contributions add in quadrature (hypot: no underflow when the
    terms are tiny, as for the far tail of a softmax)."""
    return functools.reduce(np.hypot, terms)


# --- rounding inputs to a dtype (done before both sides see them) ------------------------


def round_to(x, dtype: str) -> Array:
    """x rounded to ``dtype`` (round to nearest even), returned as float64."""
    x = np.asarray(x, dtype=np.float64)
    name = str(dtype).replace("torch.", "")
    if name == "float64":
        return x.copy()
    if name == "float32":
        return x.astype(np.float32).astype(np.float64)
    if name == "float16":
        return x.astype(np.float16).astype(np.float64)
    if name == "bfloat16":
        bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        out = rounded.astype(np.uint32).view(np.float32).astype(np.float64)
        return np.where(np.isfinite(x), out, x)
    raise ValueError(f"cannot round to dtype {dtype!r}")


def representable(x, dtype: str) -> bool:
    """Whether every finite entry of x stays finite when rounded to ``dtype``."""
    x = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x)
    return bool(np.all(np.abs(x[finite]) <= LARGEST[str(dtype).replace("torch.", "")]))


# --- comparing -------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """The outcome of one comparison against the reference."""

    fraction: float  # max |actual − expected| / bound; ≤ 1 passes
    worst_index: tuple[int, ...]
    actual: float
    expected: float
    bound: float
    problem: str = ""  # set when the comparison could not be made (shape, NaN …)
    # (actual, expected, bound) as compared: a failure's reproduction saves them
    arrays: tuple[Any, Any, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def passed(self) -> bool:
        return not self.problem and self.fraction <= 1.0

    def describe(self) -> str:
        if self.problem:
            return self.problem
        return (f"worst at {self.worst_index}: got {self.actual:.9g}, reference "
                f"{self.expected:.9g}, "
                f"|diff| {abs(self.actual - self.expected):.3g} vs budget {self.bound:.3g} "
                f"({percent_of_budget(self.fraction)})")


def percent_of_budget(fraction: float) -> str:
    """A fraction of budget as a percentage: fixed-point while readable, scientific when
    huge (a result off by 10⁵ budgets reads 1e+07%, not a 10-digit number)."""
    percent = 100 * fraction
    return f"{percent:.1f}% of budget" if percent < 1e4 else f"{percent:.2g}% of budget"


def compare(actual, expected, bound) -> Comparison:
    """Compare elementwise: |actual − expected| ≤ bound (a budget: λ × error scale).
    Where the reference is ±∞ the backend must give the same infinity; a NaN where the
    reference has none fails. The outcome carries the three arrays as given."""
    return dataclasses.replace(_compare(actual, expected, bound),
                               arrays=(actual, expected, bound))


# NumPy dtype kinds a result may not have (booleans may: a one-hot or a mask as bool; and
# kind V is also ml_dtypes' bfloat16 and float8, which JAX returns: only a record is refused)
_NOT_REAL = {"c": "complex numbers", "U": "text", "S": "bytes", "M": "dates",
             "m": "time spans", "record": "records"}


def _kind(actual: Any) -> str | None:
    """The NumPy dtype kind of a result (a tensor of another library: "c" when complex,
    else None; its values are read by NumPy later)."""
    dtype = getattr(actual, "dtype", None)
    if isinstance(dtype, np.dtype):
        return "record" if dtype.fields is not None else dtype.kind
    is_complex = getattr(actual, "is_complex", None)
    if callable(is_complex):
        try:
            return "c" if is_complex() is True else None
        except Exception:  # noqa: BLE001 — not a tensor's method after all
            return None
    return None


def _compare(actual, expected, bound) -> Comparison:
    expected = np.asarray(expected, dtype=np.float64)
    if isinstance(actual, (list, tuple, str, bytes, complex)):
        try:  # a nested list: NumPy's array of it, converted once
            actual = np.asarray(actual)
        except (TypeError, ValueError):
            pass
    if actual is None:  # NumPy would read it as a NaN of shape ()
        return Comparison(math.inf, (), math.nan, math.nan, math.nan,
                          "result is None, not a numeric array")
    kind = _kind(actual)
    if kind in _NOT_REAL:  # NumPy would drop an imaginary part and read '1.5' as a number
        return Comparison(math.inf, (), math.nan, math.nan, math.nan,
                          f"result holds {_NOT_REAL[kind]}, not real numbers")
    try:
        actual = np.asarray(actual, dtype=np.float64)
    except (TypeError, ValueError) as err:
        return Comparison(math.inf, (), math.nan, math.nan, math.nan,
                          f"result is not a numeric array ({err})")
    if actual.shape != expected.shape:
        return Comparison(math.inf, (), math.nan, math.nan, math.nan,
                          f"shape {actual.shape}, expected {expected.shape}")
    bound = np.broadcast_to(np.asarray(bound, dtype=np.float64), expected.shape)
    bad = np.isnan(actual) & ~np.isnan(expected)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return Comparison(math.inf, idx, math.nan, float(expected[idx]), float(bound[idx]),
                          f"NaN at {idx} where the reference is {float(expected[idx]):.9g}")
    infinite = ~np.isfinite(expected) | ~np.isfinite(actual)
    mismatch = infinite & (actual != expected) & ~(np.isnan(actual) & np.isnan(expected))
    if mismatch.any():
        idx = tuple(int(i) for i in np.argwhere(mismatch)[0])
        return Comparison(math.inf, idx, float(actual[idx]), float(expected[idx]),
                          float(bound[idx]), f"got {float(actual[idx]):.9g} at {idx}, "
                          f"reference {float(expected[idx]):.9g}")
    with np.errstate(invalid="ignore"):
        diff = np.where(infinite, 0.0, np.abs(actual - expected))
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(diff == 0, 0.0, diff / bound)
    if frac.size == 0:
        return Comparison(0.0, (), 0.0, 0.0, 0.0)
    idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(frac)), frac.shape))
    return Comparison(float(frac[idx]), idx, float(actual[idx]), float(expected[idx]),
                      float(bound[idx]))


def exact(actual, expected) -> Comparison:
    """Bit-for-bit equality (the budget is zero): for maps that do no arithmetic."""
    return compare(actual, expected, 0.0)


# --- error scales, one per reference function -------------------------------------------


def _zero(x) -> Array:
    return np.zeros(np.shape(x))


class _ScaleFactor:
    """The right factor B ≥ 0 of products A @ B that only set error scales, prepared once
    for many left factors. A large product (a GPT-2 unembedding's) runs in float32: its
    relative rounding, at most n·2⁻²⁴ for non-negative terms, is immaterial to a scale
    that sets a budget of λ = 6 of it, and it runs at twice float64's speed. Each row of
    A and column of B is divided by its largest entry first, so that nothing overflows
    and no row's terms underflow for the size of another's (a term below 10⁻³⁸ of its
    row's largest is negligible beside it)."""

    SMALL = 2**27  # multiply-adds: smaller products stay in float64

    def __init__(self, B: Array) -> None:
        self.B = np.asarray(B, dtype=np.float64)
        self._scaled: tuple[Array, Array] | None = None

    def product(self, A: Array) -> Array:
        A = np.asarray(A, dtype=np.float64)
        if A.size * self.B.shape[-1] < self.SMALL:
            return A @ self.B
        if self._scaled is None:
            cb = np.max(self.B, axis=-2, keepdims=True)
            cb = np.where(cb > 0, cb, 1.0)
            self._scaled = ((self.B / cb).astype(np.float32), cb)
        B32, cb = self._scaled
        ra = np.max(A, axis=-1, keepdims=True)
        ra = np.where(ra > 0, ra, 1.0)
        return ((A / ra).astype(np.float32) @ B32).astype(np.float64) * ra * cb


def _linear_scales(W, b) -> tuple[_ScaleFactor, tuple[_ScaleFactor, Array], Array | float, int]:
    """What linear_bound needs of W and b: |W| and (W/c)² as scale factors with c each
    column's largest |W| (squared as they are, entries below ~1e-154 underflow), |b|, n."""
    W = np.asarray(W, dtype=np.float64)
    absb = 0.0 if b is None else np.abs(b)
    top = np.max(np.abs(W), axis=0, keepdims=True) if W.shape[0] else np.ones((1, W.shape[1]))
    top = np.where(top > 0, top, 1.0)
    return (_ScaleFactor(np.abs(W)), (_ScaleFactor(np.square(W / top)), top), absb,
            W.shape[0] + (0 if b is None else 1))


def _linear_error(x, ex, scales, y, p: Precision) -> Array:
    abs_w, (square_w, top), absb, n = scales
    ex = np.abs(np.asarray(ex, dtype=np.float64))
    rows = np.max(ex, axis=-1, keepdims=True) if ex.shape[-1] else np.ones(ex.shape[:-1] + (1,))
    rows = np.where(rows > 0, rows, 1.0)
    inherited = np.sqrt(square_w.product(np.square(ex / rows))) * rows * top
    local = p.inner_product_scale(n, abs_w.product(np.abs(x)) + absb, y)
    return _q(inherited, local, p.store(y))


def linear_bound(x, ex, W, b, p: Precision) -> tuple[Array, Array]:
    """y = xW + b: inherited √(ex² W²), the inner product's √n·u(|x||W| + |b|), storage."""
    y = ref.linear(x, W, b)
    return y, _linear_error(x, ex, _linear_scales(W, b), y, p)


def _slope(name: str, x: Array) -> Array:
    """|σ'(x)|; for GELU the exact derivative Φ(x) + xφ(x) (the tanh form's differs by
    under 2·10⁻³, covered by the curvature allowance in activation_bound)."""
    if name == "relu":
        return (x > 0).astype(np.float64)
    phi = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return np.abs(0.5 * (1 + erf(x / math.sqrt(2))) + x * phi)


def activation_bound(name: str, x, ex, p: Precision) -> tuple[Array, Array]:
    """y = σ(x): inherited |σ'(x)|·ex, widened by the curvature over λ·ex (|σ''| ≤ 1 for
    every activation here, and ReLU's kink: slope 1 within λ·ex of 0), plus the
    evaluation's roundings."""
    x = np.asarray(x, dtype=np.float64)
    y = getattr(ref, name)(x)
    ex = np.asarray(ex, dtype=np.float64)
    if name == "relu":
        slope = np.where(np.abs(x) <= LAMBDA * ex, 1.0, _slope(name, x))
    else:
        slope = _slope(name, x) + 2e-3 + LAMBDA * ex
    local = ROUNDINGS[name] * p.u_acc * (np.abs(y) + np.abs(x))
    return y, _q(slope * ex, local, p.store(y))


def log_exp_factor(delta: Array) -> Array:
    """log((exp(λ·δ) − 1)/λ), finite for any δ > 0 (−∞ at δ = 0): the logarithm of the
    scale of the relative error exp(δ') − 1 that an error δ' of scale δ in an exponent
    causes. At the budget's level (λ·scale) the factor is exact: exp(λδ) − 1 is the
    relative effect of an exponent moved by λδ. For small δ it is δ, the first-order rule;
    for large δ it grows as the exponential does, so a score moved by several units (as a
    16-bit rounding of a large score is) is not budgeted linearly."""
    t = LAMBDA * np.asarray(delta, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(t > 30, t, np.log(np.expm1(np.minimum(t, 30)))) - math.log(LAMBDA)


def softmax_bound(z, ez, p: Precision, axis: int = -1, terms: Array | None = None
                  ) -> tuple[Array, Array]:
    """y = softmax(z) computed as exp(z − max z)/Σ: y_i' = y_i·e^{δz_i}/Σ_j y_j e^{δz_j}.
    The numerator's relative error has scale r_i = (exp(λδz_i) − 1)/λ (log_exp_factor;
    δz_i when δz is small); the normaliser's ν = √(Σ_j (y_j r_j)²) (to first order
    Σ_j y_j δz_j, independent terms); the ratio (1 + r_i)/(1 + ν) then has relative error
    √(r_i² + ν²)/(1 − λν), the last factor the normaliser's own nonlinearity (1 to first
    order). Where λν ≥ 1 the normaliser, and so y_i, may be anything: both results lie in
    [0, 1], so the error is at most max(y_i, 1 − y_i), where every error scale is capped
    (over λ). All in logarithms, so a weight that underflows (y_i = 0 in float64) while
    its exponent's error is large gets its budget. δz includes the rounding of the shift
    z − max z (u_acc|z − max z|); each exponential and the division add a few roundings,
    the sum √n·u_acc. ``terms``: how many terms each row's sum has (broadcast against z,
    the axis kept), where that is fewer than the axis's length: a masked score (−∞) is an
    exact zero in the sum, which rounds nothing (attention_bound counts the visible keys),
    so row t of a causal mask errs as a softmax over its t + 1 keys does."""
    z = np.asarray(z, dtype=np.float64)
    y = ref.softmax(z, axis=axis)
    finite = np.isfinite(z)
    shift = np.where(finite, np.abs(z - np.max(z, axis=axis, keepdims=True)), 0.0)
    dz = np.where(finite, _q(ez, p.u_acc * shift), 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_y = np.where(finite, ref.log_softmax(np.where(finite, z, -np.inf), axis=axis),
                         -np.inf)
        log_r = log_exp_factor(dz)
        log_nu = 0.5 * _logsumexp(2 * (log_y + log_r), axis)
        lam_nu = LAMBDA * np.exp(np.minimum(log_nu, 0.0))
        log_rel = 0.5 * np.logaddexp(2 * log_r, 2 * log_nu) - np.log1p(-np.minimum(lam_nu, 1.0))
        inherited = np.where(~finite, 0.0, np.where(lam_nu < 1, np.exp(np.minimum(
            log_y + log_rel, 0.0)), np.inf))
    n = z.shape[axis] if terms is None else terms
    local = y * ((ROUNDINGS["exp"] + ROUNDINGS["softmax_normalise"]) * p.u_acc
                 + p.same_sign_sum_scale(n))
    cap = np.where(finite, np.maximum(y, 1 - y) / LAMBDA, 0.0)
    return y, _q(np.minimum(inherited, cap), local, p.store(y))


def _logsumexp(a: Array, axis: int) -> Array:
    """log Σ exp(a) along ``axis`` (kept), −∞ for an all −∞ row."""
    top = np.max(a, axis=axis, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return safe + np.log(np.sum(np.exp(a - safe), axis=axis, keepdims=True))


def sequence_log_probability_bound(tokens, z, p: Precision) -> tuple[float, float]:
    """y = Σ_{t≥2} log p_t, log p_t = (z_{t−1,x_t} − m) − log Σ_j exp(z_{t−1,j} − m) with
    m the row's max. Each log p_t: the shift, its exponentials, the logarithm and the
    subtraction round once each, u(|z − m| + lse + 4); the normaliser is a sum of V
    positive terms, whose relative error is the logarithm's absolute one. Those terms are
    nearly equal in a flat row, where a sequential sum rounds the same way at every step:
    same_sign_sum_scale(V), not the √V·u of independent roundings (the built-in backend in
    float32, vocabulary 100277, near-tied logits, used 144% of the √V budget). The sum over
    t adds terms of one sign (every log p_t ≤ 0) in the same way, and the result may be
    stored in the dtype (u|y|: in bfloat16 a sum near −3114 lies on a grid of 16).
    Returns (y, its error scale)."""
    z = np.asarray(z, dtype=np.float64)
    T, V = z.shape
    y = float(ref.sequence_log_probability(tokens, z))
    shifted = z[:-1] - z[:-1].max(axis=-1, keepdims=True)
    lse = np.log(np.exp(shifted).sum(axis=-1))
    picked = shifted[np.arange(T - 1), np.asarray(tokens)[1:]]
    per_token = p.u * (np.abs(picked) + lse + 4.0) + p.same_sign_sum_scale(V)
    scale = (math.sqrt(np.sum(np.square(per_token)))
             + p.same_sign_sum_scale(T - 1) * np.sum(np.abs(picked - lse)))
    return y, float(np.hypot(scale, p.store(np.asarray(y))) + p.tiny)


def layer_norm_parts(x, ex, eps: float, p: Precision) -> tuple[Array, Array, Array, Array]:
    """x̂ = (x − μ)/s, s = √(σ² + ε), and their error scales (x̂'s absolute, s's relative).
    First order: δx̂ = (δx − mean δx − x̂·mean(x̂ δx))/s, plus the roundings of μ
    (√n·u mean|x|), of x − μ, of σ² (√n·u relative) and of the square root and the
    division. Returns (x̂, its error scale, s, s's relative error scale)."""
    x = np.asarray(x, dtype=np.float64)
    ex = np.asarray(ex, dtype=np.float64)
    n = x.shape[-1]
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    s = np.sqrt(var + eps)
    xhat = (x - mu) / s
    rms = root_mean_square
    e_mu = _q(rms(ex) / math.sqrt(n),
              p.same_sign_sum_scale(n) * np.mean(np.abs(x), -1, keepdims=True))
    e_centered = _q(ex, e_mu, p.u_acc * np.abs(x - mu))
    # σ² = mean((x − μ)²): first order 2·mean((x − μ)·δ(x − μ)), plus the sum's rounding.
    e_var = _q(2 * rms(np.abs(x - mu) * e_centered) / math.sqrt(n),
               (p.same_sign_sum_scale(n) + 2 * p.u_acc) * var)
    rel_s = _q(0.5 * e_var / (var + eps), 2 * p.u_acc)  # the root, and ε's addition
    e_xhat = _q(e_centered / s, np.abs(xhat) * rel_s, p.u_acc * np.abs(xhat))
    return xhat, e_xhat, s, rel_s


def layer_norm_bound(x, ex, gamma, beta, eps: float, p: Precision) -> tuple[Array, Array]:
    """y = γ x̂ + β (x̂ and its error from layer_norm_parts): γ scales x̂'s error, and the
    product and the sum each round."""
    y = ref.layer_norm(np.asarray(x, dtype=np.float64), gamma, beta, eps)
    xhat, e_xhat, _, _ = layer_norm_parts(x, ex, eps, p)
    e = _q(np.abs(gamma) * e_xhat, p.u_acc * (np.abs(gamma * xhat) + np.abs(beta)))
    return y, _q(e, p.store(y))


def root_sum_square(x, axis, keepdims: bool = False) -> Array:
    """√(Σ x²) along ``axis``, scaled by the largest |x| first: squared as they are, terms
    below ~1e-154 underflow to zero in float64 (see _quadrature_product)."""
    x = np.abs(np.asarray(x, dtype=np.float64))
    top = np.max(x, axis=axis, keepdims=True) if x.size else np.ones_like(x)
    top = np.where(top > 0, top, 1.0)
    out = np.sqrt(np.sum(np.square(x / top), axis=axis, keepdims=True)) * top
    return out if keepdims else np.squeeze(out, axis=axis)


def root_mean_square(x, axis: int = -1) -> Array:
    """√(mean x²) along ``axis`` (kept), scaled as root_sum_square is."""
    n = np.shape(x)[axis]
    return root_sum_square(x, axis, keepdims=True) / math.sqrt(n) if n else \
        np.zeros(np.shape(np.sum(x, axis=axis, keepdims=True)))


def _quadrature_product(X, Y) -> Array:
    """√(Σ_k X_ik² Y_kj²) with each row of X and column of Y scaled to its largest entry
    first: squared as they are, errors below ~1e-154 (the far tail of a softmax) underflow
    to zero in float64 and their budget vanished (a float64 false alarm, seed 31337)."""
    X, Y = np.abs(np.asarray(X, dtype=np.float64)), np.abs(np.asarray(Y, dtype=np.float64))
    rows = np.max(X, axis=-1, keepdims=True) if X.shape[-1] else np.ones(X.shape[:-1] + (1,))
    cols = np.max(Y, axis=-2, keepdims=True) if Y.shape[-2] else np.ones(Y.shape[:-2] + (1,) + Y.shape[-1:])
    rows, cols = np.where(rows > 0, rows, 1.0), np.where(cols > 0, cols, 1.0)
    return np.sqrt(np.square(X / rows) @ np.square(Y / cols)) * rows * cols


def matmul_bound(A, eA, B, eB, p: Precision, terms: Array | None = None
                 ) -> tuple[Array, Array]:
    """C = A B with errors in both factors. ``terms``: how many of each row's products
    are not exact zeros (default: all, A's last axis), with the axis kept: a product with
    a zero of A (a masked attention weight, with no error) adds nothing and rounds nothing."""
    A, B = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
    C = A @ B
    n = A.shape[-1] if terms is None else terms
    inherited = np.hypot(_quadrature_product(eA, B), _quadrature_product(A, eB))
    local = p.inner_product_scale(n, np.abs(A) @ np.abs(B), C)
    drift = 0.0
    if p.tiny > FLOOR_WORTH_A_TERM:
        drift = (np.abs(A) @ p.subnormal(B, eB) + p.subnormal(A, eA) @ np.abs(B)) * p.floor_drift
    return C, _q(inherited, local, drift, p.store(C))


def scores_error(QK, eQK, Q, K, p: Precision) -> Array:
    """The error scale of S = Q Kᵀ/√d_k from that of the product Q Kᵀ (``matmul_bound``):
    the stored result's rounding u·|S|, and the two roundings of a backend that scales Q
    and K by d_k^(−1/4) before the product (as fused kernels do, so that Q Kᵀ cannot
    overflow where S does not), 2·u_acc·|Q||K|ᵀ/√d_k."""
    dk = np.shape(Q)[-1]
    prescaled = 2 * p.u_acc * (np.abs(np.asarray(Q, dtype=np.float64))
                               @ np.abs(np.swapaxes(np.asarray(K, dtype=np.float64), -1, -2)))
    return _q(eQK, p.u * np.abs(QK), prescaled) / math.sqrt(dk)


def attention_bound(Q, eQ, K, eK, V, eV, M, p: Precision, visible_keys: bool = False,
                    weights_apart: bool = False) -> tuple[Array, Array, Array, Array]:
    """softmax(QKᵀ/√d_k + M)V, stage by stage: scores, weights, output.
    Returns (weights, their error scale, output, its error scale). ``visible_keys``: each
    row's sums counted over the keys it sees (see below), else over all of them.
    ``weights_apart``: the output's error scale without the weights' errors, for a caller
    that propagates them itself (``multi_head_attention_bound``)."""
    dk = np.shape(Q)[-1]
    KT, eKT = np.swapaxes(K, -1, -2), np.swapaxes(eK, -1, -2)
    S, eS = matmul_bound(Q, eQ, KT, eKT, p)
    S, eS = S / math.sqrt(dk), scores_error(S, eS, Q, K, p)
    masked = np.isneginf(np.asarray(M, dtype=np.float64))
    S = np.where(masked, -np.inf, S + M)
    eS = np.where(masked, 0.0, eS)
    # With visible_keys, both sums over the keys (softmax's normaliser, A V) have as many
    # terms as the row sees keys: a masked key's weight is an exact 0 (exp(−∞)), which
    # rounds nothing in the sums themselves. Generation asks it for the rows it reads
    # (each the last row of its context: all its keys visible, as the context's own bound
    # counts them). The other rows keep the whole row's count: counted per row, the
    # operation's own check failed two correct bfloat16 backends at seed 537006488 (137 %
    # at row 254), so a per-row count is not yet shown to bound every row.
    seen = (np.sum(~np.broadcast_to(masked, np.shape(S)), axis=-1, keepdims=True)
            if visible_keys else None)
    A, eA = softmax_bound(S, eS, p, terms=seen)
    eA = np.where(masked, 0.0, eA)
    O, eO = matmul_bound(A, 0 * eA if weights_apart else eA, V, eV, p, terms=seen)
    if weights_apart:
        return A, eA, O, eO
    # Where a row's weights are only known to lie in [0, 1] (softmax_bound's cap: the
    # scores' error moves them by O(1)), their errors are not independent: they sum to 0,
    # so a weight moving from key a to key b moves the output by V_b − V_a, up to the
    # range of V over the visible keys, √2 more than the quadrature sum allows. Both the
    # exact and the computed row are convex combinations of those V rows: the range (with
    # V's own error) bounds the output's error there, and is what such rows get.
    masked = np.broadcast_to(masked, np.shape(A))
    saturated = _saturated(A, eA, masked)
    if np.any(saturated):
        V, eV = np.asarray(V, dtype=np.float64), np.asarray(eV, dtype=np.float64)
        top, bottom = _visible_range(V + LAMBDA * eV, V - LAMBDA * eV, masked)
        eO = np.where(saturated, np.maximum(eO, (top - bottom) / LAMBDA), eO)
    # Where a row's weights all lie within a factor 1 + 2u of each other, storing them
    # rounds them alike (they share one or two cells of the dtype's grid), so the
    # roundings are not independent: they follow the weights' own small differences,
    # which carry the output (near-equal scores), and can remove them whole. Their effect
    # is then bounded only by its worst case, u·Σ_j A_j |V_j|, not the quadrature sum
    # (the soundness gate: two correct bfloat16 backends at 137 % of the budget on a row
    # of 255 weights within 0.1 % of each other, seed 537006488).
    alike = _alike(A, masked, p)
    if np.any(alike):
        coherent = p.u * (np.abs(A) @ np.abs(np.asarray(V, dtype=np.float64)))
        eO = np.where(alike, np.maximum(eO, coherent), eO)
    return A, eA, O, eO


def _saturated(A, eA, masked) -> Array:
    """Rows (…, 1) with a weight only known to lie in [0, 1]: softmax_bound's cap, where
    the scores' error moves the weights by O(1)."""
    return np.any(~masked & (LAMBDA * eA >= np.maximum(A, 1 - A)), axis=-1, keepdims=True)


def _visible_range(high, low, masked) -> tuple[Array, Array]:
    """Each row's max of ``high`` and min of ``low`` (…, keys, d) over the keys it sees
    (``masked`` (…, rows, keys) False): (…, rows, d). Where every row sees a prefix of the
    keys (the causal mask), running extremes along the keys, read at the row's last
    visible key: T·d work, where the masked broadcast is T²·d (seconds per draw at
    T = 1024, and most of a thorough run's attention checks)."""
    shape = np.broadcast_shapes(np.shape(high)[:-2], np.shape(masked)[:-2])
    visible = np.broadcast_to(~masked, shape + np.shape(masked)[-2:])
    seen = np.sum(visible, axis=-1)
    if np.all(seen > 0) and np.all(visible[..., :-1] >= visible[..., 1:]):  # prefixes
        last = np.broadcast_to((seen - 1)[..., None], shape + seen.shape[-1:] + high.shape[-1:])
        top = np.broadcast_to(np.maximum.accumulate(high, axis=-2), shape + high.shape[-2:])
        bottom = np.broadcast_to(np.minimum.accumulate(low, axis=-2), top.shape)
        return (np.take_along_axis(top, last, axis=-2),
                np.take_along_axis(bottom, last, axis=-2))
    visible = visible[..., :, :, None]
    high, low = (np.broadcast_to(X[..., None, :, :], visible.shape[:-1] + X.shape[-1:])
                 for X in (high, low))
    return (np.max(np.where(visible, high, -np.inf), axis=-2),
            np.min(np.where(visible, low, np.inf), axis=-2))


def _alike(A, masked, p: Precision) -> Array:
    """Rows (…, 1) of more than one visible weight, all within a factor 1 + 2u."""
    shown = np.where(masked, np.nan, A)
    with np.errstate(invalid="ignore"):
        alike = (np.nanmax(shown, axis=-1, keepdims=True)
                 <= np.nanmin(shown, axis=-1, keepdims=True) * (1 + 2 * p.u))
    return alike & (np.sum(~masked, axis=-1, keepdims=True) > 1)


def multi_head_attention_bound(H, eH, W_qkv, b_qkv, W_O, b_O, n_heads: int,
                               p: Precision, rows: list[int] | None = None
                               ) -> tuple[Array, Array]:
    """``rows``: the output of those positions only (their queries against every key),
    each row's sums counted over the keys it sees (generation's rows: see
    attention_bound's visible_keys)."""
    QKV, eQKV = linear_bound(H, eH, W_qkv, b_qkv, p)
    d = QKV.shape[-1] // 3
    parts = [(ref.split_heads(QKV[..., i * d:(i + 1) * d], n_heads),
              ref.split_heads(eQKV[..., i * d:(i + 1) * d], n_heads)) for i in range(3)]
    (Q, eQ), (K, eK), (V, eV) = parts
    M = ref.causal_mask(np.shape(H)[-2])
    if rows is not None:
        Q, eQ, M = Q[..., rows, :], eQ[..., rows, :], M[rows]
    A, eA, O, eO = attention_bound(Q, eQ, K, eK, V, eV, M, p, visible_keys=rows is not None,
                                   weights_apart=True)
    y, ey = linear_bound(ref.merge_heads(O), ref.merge_heads(eO), W_O, b_O, p)
    return y, _q(ey, _weight_moves(A, eA, V, eV, np.isneginf(M), W_O, p))


def _weight_moves(A, eA, V, eV, masked, W_O, p: Precision) -> Array:
    """The output's error (…, T_rows, d) from the attention weights' errors, propagated
    through W_O per head. An error of weight j moves every component of the head's
    output along V_j, so through W_O it moves output k by itself times (V W_O⁽ⁱ⁾)_jk: it
    adds coherently over the d_k components (up to √d_k past a quadrature sum over them:
    83 % of the budget for a correct bfloat16 backend with aligned V and W_O), and in
    quadrature over the keys. Where the weights are only known in [0, 1] (saturated
    rows), the computed and the exact head output are two convex combinations of the
    value rows, so output k lies within the range of (V W_O⁽ⁱ⁾)_k over the visible keys
    (a correct bfloat16 backend at 133 % of the quadrature budget, thorough seed 138423:
    two scores 42 apart at 1.4·10⁴ swapped); where they all lie within 1 + 2u, storing
    them rounds them alike: u Σ_j A_j |(V W_O⁽ⁱ⁾)_jk| (see attention_bound)."""
    masked = np.broadcast_to(masked, np.shape(A))
    saturated, alike = _saturated(A, eA, masked), _alike(A, masked, p)
    V, eV, W_O = (np.asarray(X, dtype=np.float64) for X in (V, eV, W_O))
    n_heads, dk = V.shape[-3], V.shape[-1]
    moves = []
    for i in range(n_heads):
        W_i = W_O[i * dk:(i + 1) * dk]
        Z = V[..., i, :, :] @ W_i  # (…, keys, d)
        head = _quadrature_product(eA[..., i, :, :], Z)
        if np.any(saturated[..., i, :, :]):
            eZ = LAMBDA * _quadrature_product(eV[..., i, :, :], W_i)
            top, bottom = _visible_range(Z + eZ, Z - eZ, masked[..., i, :, :])
            head = np.where(saturated[..., i, :, :], np.maximum(head, (top - bottom) / LAMBDA),
                            head)
        if np.any(alike[..., i, :, :]):
            rounded = p.u * (np.abs(A[..., i, :, :]) @ np.abs(Z))
            head = np.where(alike[..., i, :, :], np.maximum(head, rounded), head)
        moves.append(head)
    return _q(*moves)


def ffn_bound(variant: str, x, ex, W_1, b_1, W_2, b_2, p: Precision) -> tuple[Array, Array]:
    act = "relu" if variant in ("relu", "guide_product") else variant
    a, ea = linear_bound(x, ex, W_1, b_1, p)
    g, eg = activation_bound(act, a, ea, p)
    if variant == "guide_product":
        a2, ea2 = linear_bound(x, ex, W_2, b_2, p)
        g2, eg2 = activation_bound("relu", a2, ea2, p)
        y = g * g2
        return y, _q(eg * np.abs(g2), np.abs(g) * eg2, eg * eg2, p.store(y))
    return linear_bound(g, eg, W_2, b_2, p)


def add_bound(x, ex, y, ey, p: Precision) -> tuple[Array, Array]:
    s = np.asarray(x, dtype=np.float64) + np.asarray(y, dtype=np.float64)
    return s, _q(ex, ey, p.store(s))


def block_bound(H, eH, bp: dict, config: GPTConfig, p: Precision,
                rows: list[int] | None = None) -> tuple[Array, Array]:
    """One block of any variant; ``bp`` holds its parameters without the prefix.
    ``rows``: the output of those positions only (every position is still a key)."""
    eps = config.ln_eps
    if rows is None:
        Hr, eHr = H, eH
    else:
        Hr, eHr = H[..., rows, :], eH[..., rows, :]

    def ln(X, eX, which):
        return layer_norm_bound(X, eX, bp[f"{which}.weight"], bp[f"{which}.bias"], eps, p)

    def attn(X, eX):
        return multi_head_attention_bound(X, eX, bp["attn.w_qkv"], bp.get("attn.b_qkv"),
                                          bp["attn.w_o"], bp.get("attn.b_o"),
                                          config.n_heads, p, rows)

    def ffn(X, eX):
        return ffn_bound(config.ffn, X, eX, bp["ffn.w_1"], bp.get("ffn.b_1"), bp["ffn.w_2"],
                         bp.get("ffn.b_2"), p)

    if config.norm == "pre":  # H' = H + MHA(LN_1(H)); H' + FFN(LN_2(H'))
        A, eA = attn(*ln(H, eH, "ln_1"))
        H1, eH1 = add_bound(Hr, eHr, A, eA, p)
        F, eF = ffn(*ln(H1, eH1, "ln_2"))
        return add_bound(H1, eH1, F, eF, p)
    if config.norm == "post":  # H' = LN_1(H + MHA(H)); LN_2(H' + FFN(H'))
        A, eA = attn(H, eH)
        H1, eH1 = ln(*add_bound(Hr, eHr, A, eA, p), "ln_1")
        F, eF = ffn(H1, eH1)
        return ln(*add_bound(H1, eH1, F, eF, p), "ln_2")
    F, eF = ffn(*attn(H, eH))  # the Guide: LN(FFNN(Attention(H)) + H)
    return ln(*add_bound(F, eF, Hr, eHr, p), "ln_1")


def hidden_bound(tokens, params: dict, config: GPTConfig, p: Precision,
                 rows: list[int] | None = None) -> tuple[Array, Array]:
    """The last hidden state (after the final LayerNorm, if any) and its error scale.
    ``rows``: of those positions only, as the whole sequence's rows (every block but the
    last needs every position: they are the last one's keys). Row t depends on the tokens
    up to t only; a row read counts its own keys in the last block (attention_bound's
    visible_keys), so it bounds at least what the first t + 1 tokens' own bound does."""
    tokens = np.asarray(tokens)
    T = tokens.shape[-1]
    E = ref.token_embedding(tokens, params["wte"])
    H, eH = E, _zero(E)  # a row copy: exact
    if config.positional_embedding:
        P = ref.positional_embedding(T, params["wpe"])
        H, eH = add_bound(E, _zero(E), np.broadcast_to(P, E.shape), _zero(E), p)
    for layer in range(config.n_layers):
        last = layer == config.n_layers - 1
        H, eH = block_bound(H, eH, block_parameters(params, layer), config, p,
                            rows if last else None)
    if rows is not None and config.n_layers == 0:
        H, eH = H[..., rows, :], eH[..., rows, :]
    if config.final_norm:
        H, eH = layer_norm_bound(H, eH, params["ln_f.weight"], params["ln_f.bias"],
                                 config.ln_eps, p)
    return H, eH


def output_bound(H, eH, params: dict, config: GPTConfig, p: Precision) -> Array:
    """The logits' error scale from the last hidden state's (any subset of positions)."""
    if config.tied_embeddings:
        _, e = linear_bound(H, eH, np.asarray(params["wte"]).T, None, p)
    else:
        _, e = linear_bound(H, eH, params["w_u"], params.get("b_u"), p)
    return e


def output_bound_blocks(H, eH, params: dict, config: GPTConfig, p: Precision, rows: int
                        ) -> Iterator[tuple[slice, Array, Array]]:
    """output_bound ``rows`` positions at a time, for a vocabulary too large to hold every
    float64 logit and its error scale at once (|W| and W² prepared once): yields the
    positions, their logits (the unembedding of H, by ref.linear) and error scales."""
    if config.tied_embeddings:
        W, b = np.asarray(params["wte"]).T, None
    else:
        W, b = params["w_u"], params.get("b_u")
    scales = _linear_scales(W, b)
    for start in range(0, np.shape(H)[-2], rows):
        at = slice(start, start + rows)
        y = ref.linear(H[..., at, :], W, b)
        yield at, y, _linear_error(H[..., at, :], eH[..., at, :], scales, y, p)


def gpt_forward_bound(tokens, params: dict, config: GPTConfig, p: Precision) -> Array:
    """The error scale of every logit of the whole model."""
    H, eH = hidden_bound(tokens, params, config, p)
    return output_bound(H, eH, params, config, p)
