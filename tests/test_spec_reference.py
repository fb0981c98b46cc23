"""The float64 reference agrees with the spec's sympy meaning, evaluated at 40 digits.

For every forward-pass entry with a sympy form, random inputs of the shapes in its
``sympy_inputs`` (small sizes) are given to both: as exact sympy Floats of 40 digits to
the sympy form, whose result is evaluated with ``evalf(40)``, and as the same float64
values to the reference function. The reference must agree to 1e-12, normwise relative
(and exactly where the result is ±∞). The meta-tests at the end show that the comparison
rejects deliberately wrong references.

Shapes in ``sympy_inputs`` (see spec/embedding.py): ``(a, b)`` a real matrix; ``[k](a, b)``
a list of k matrices (an array (k, a, b) for the reference); ``(T,) int < V`` token ids;
``int X`` the size X; ``() > 0`` a positive scalar; ``(T, T) mask`` a real matrix, tried
both finite and as the causal mask; ``config`` / ``params`` / ``block params``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mpmath
import numpy as np
import pytest
import sympy as sp

from gptspec import reference
from gptspec.reference import attention, block, embedding, output
from gptspec.spec import REGISTRY, Equation, GPTConfig, parameter_schema

GROUPS = ("embedding", "attention", "block", "output")
RTOL = 1e-12
DIGITS = 40

SIZES = {"T": 3, "n_ctx": 4, "d_model": 4, "h": 2, "d_k": 3, "d_ff": 5, "V": 5, "n": 4, "m": 2}


def tiny(**changes: Any) -> GPTConfig:
    base = dict(vocab_size=SIZES["V"], n_ctx=SIZES["n_ctx"], d_model=SIZES["d_model"],
                n_layers=1, n_heads=SIZES["h"], d_ff=SIZES["d_ff"])
    return GPTConfig(**{**base, **changes})


# The configurations each config-taking entry is checked under: every FFN variant, with and
# without biases, a large eps (so its place in the formula shows), tied and untied.
CONFIGS: dict[str, list[GPTConfig]] = {
    "block_pre_ln": [tiny(), tiny(ffn="relu", attn_bias=False, ffn_bias=False),
                     tiny(ffn="gelu", ln_eps=0.25)],
    "block_post_ln": [tiny(norm="post", ffn="relu", ln_eps=0.25, attn_bias=False),  # Blueprint
                      tiny(norm="post", ffn="gelu_tanh")],
    "block_guide": [tiny(norm="guide", ffn="guide_product", d_ff=SIZES["d_model"]),
                    tiny(norm="guide", ffn="gelu", attn_bias=False, ffn_bias=False, ln_eps=0.25)],
    "gpt_forward": [
        tiny(),
        tiny(norm="post", ffn="relu", final_norm=False, ln_eps=0.25),
        tiny(norm="guide", ffn="guide_product", d_ff=SIZES["d_model"], tied_embeddings=False,
             output_bias=True, final_norm=False),
        tiny(ffn="gelu", tied_embeddings=False, attn_bias=False, ffn_bias=False),
        tiny(norm="guide", ffn="guide_product", d_ff=SIZES["d_model"], tied_embeddings=False,
             output_bias=True, final_norm=False, attn_bias=False, positional_embedding=False),
        tiny(d_head=SIZES["d_k"]),  # h·d_k ≠ d_model: the Notes' free head width
        tiny(n_layers=2),  # the layers must be applied in order, each with its own parameters
    ],
}


def forward_entries() -> list[Equation]:
    return [e for e in REGISTRY if e.group in GROUPS]


def size(expr: str) -> int:
    return int(sp.sympify(expr, locals={k: sp.Symbol(k) for k in SIZES}).subs(SIZES))


def dims(text: str) -> tuple[int, ...]:
    return tuple(size(part) for part in text.split(",") if part.strip())


def _float(value: float) -> sp.Float:
    return sp.Float(float(value), DIGITS)  # the float64 value exactly, carried at 40 digits


def to_sympy(value: Any) -> Any:
    """A NumPy input as the sympy form takes it: 1-D and 2-D arrays as matrices (a 1-D
    array as a row), 3-D as a list of matrices, a scalar as a Float."""
    if isinstance(value, np.ndarray):
        if value.ndim == 3:
            return [to_sympy(a) for a in value]
        a = value.reshape(1, -1) if value.ndim == 1 else value
        return sp.Matrix(a.shape[0], a.shape[1], lambda i, j: _float(a[i, j]))
    return _float(value)


def random_parameters(config: GPTConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    # Unit-scale values (not GPT-2's 0.02) so that every non-linearity is exercised.
    return {s.name: rng.normal(size=s.shape) for s in parameter_schema(config)}


def cases(entry: Equation, rng: np.random.Generator) -> Iterator[tuple[list, list, str]]:
    """(sympy arguments, reference arguments, label) for each case of the entry."""
    configs = CONFIGS.get(entry.id, [None])
    masks = ["finite", "causal"] if any(s.endswith("mask") for _, s in entry.sympy_inputs) \
        else [None]
    for config in configs:
        for mask in masks:
            sym_args: list = []
            ref_args: list = []
            for name, shape in entry.sympy_inputs:
                if m := re.fullmatch(r"\((.*)\) int < (\w+)", shape):
                    tokens = rng.integers(0, size(m[2]), size=dims(m[1]))
                    sym_args.append([int(t) for t in tokens])
                    ref_args.append(tokens)
                elif m := re.fullmatch(r"int (\w+)", shape):
                    sym_args.append(size(m[1]))
                    ref_args.append(size(m[1]))
                elif shape == "() > 0":
                    value = float(rng.uniform(0.05, 1.0))
                    sym_args.append(_float(value))
                    ref_args.append(value)
                elif m := re.fullmatch(r"\[(\w+)\]\((.*)\)", shape):
                    array = rng.normal(size=(size(m[1]), *dims(m[2])))
                    sym_args.append(to_sympy(array))
                    ref_args.append(array)
                elif m := re.fullmatch(r"\((.*)\)( mask)?", shape):
                    array = rng.normal(size=dims(m[1]))
                    if m[2] and mask == "causal":
                        array = attention.causal_mask(array.shape[0])
                        sym_args.append(sp.Matrix(array.shape[0], array.shape[1],
                                                  lambda i, j: -sp.oo if j > i else 0))
                    else:
                        sym_args.append(to_sympy(array))
                    ref_args.append(array)
                elif shape == "config":
                    assert config is not None, f"{entry.id}: add its configurations to CONFIGS"
                    sym_args.append(config)
                    ref_args.append(config)
                elif shape in ("params", "block params"):
                    assert config is not None, f"{entry.id}: add its configurations to CONFIGS"
                    params = random_parameters(config, rng)
                    if shape == "block params":
                        params = block.block_parameters(params, 0)
                    sym_args.append({k: to_sympy(v) for k, v in params.items()})
                    ref_args.append(params)
                else:
                    raise AssertionError(f"{entry.id}: input {name!r} has unknown shape {shape!r}")
            label = ", ".join(filter(None, [config and _describe(config), mask and f"{mask} mask"]))
            yield sym_args, ref_args, label


def _describe(config: GPTConfig) -> str:
    return (f"norm={config.norm} ffn={config.ffn} attn_bias={config.attn_bias} ffn_bias={config.ffn_bias} "
            f"tied={config.tied_embeddings} final_norm={config.final_norm} eps={config.ln_eps}")


def _mpf(value: sp.Expr) -> mpmath.mpf:
    value = sp.sympify(value).evalf(DIGITS)
    if value in (sp.oo, -sp.oo):
        return mpmath.mpf("inf") if value == sp.oo else mpmath.mpf("-inf")
    if not value.is_Number:
        raise AssertionError(f"the sympy form did not evaluate to a number: {value}")
    with mpmath.workdps(DIGITS + 10):  # mpf() rounds to the working precision
        return mpmath.mpf(sp.Float(value, DIGITS)._mpf_)


def exact_arrays(result: Any) -> list[np.ndarray]:
    """The sympy form's result as object arrays of 40-digit mpf, one per output."""
    if isinstance(result, tuple):
        return [a for part in result for a in exact_arrays(part)]
    if isinstance(result, list):  # a list of matrices: one (k, a, b) array
        return [np.stack([exact_arrays(m)[0] for m in result])]
    if isinstance(result, sp.MatrixBase):
        return [np.array([[_mpf(v) for v in result.row(i)] for i in range(result.rows)],
                         dtype=object).reshape(result.shape)]
    return [np.array(_mpf(result), dtype=object)]


def reference_arrays(result: Any) -> list[np.ndarray]:
    if isinstance(result, tuple):
        return [a for part in result for a in reference_arrays(part)]
    return [np.asarray(result)]


def relative_error(got: np.ndarray, exact: np.ndarray) -> float:
    """‖got − exact‖ / ‖exact‖ over the finite entries (Frobenius, at 50 digits); infinite
    entries must be equal. An exact zero needs an exact zero."""
    if got.shape != exact.shape:
        raise AssertionError(f"shape {got.shape}, expected {exact.shape}")
    if got.dtype != np.float64:
        raise AssertionError(f"dtype {got.dtype}, expected float64")
    if np.isnan(got).any():
        raise AssertionError("NaN in the result")
    with mpmath.workdps(DIGITS + 10):
        inf = np.vectorize(mpmath.isinf, otypes=[bool])(exact)
        if not np.array_equal(inf, np.isinf(got)) or any(
                mpmath.mpf(float(g)) != e for g, e in zip(got[inf], exact[inf], strict=True)):
            raise AssertionError("the infinite entries differ")
        diff = mpmath.fsum((mpmath.mpf(float(g)) - e) ** 2
                           for g, e in zip(got[~inf], exact[~inf], strict=True))
        norm = mpmath.fsum(e ** 2 for e in exact[~inf])
        if norm == 0:
            return 0.0 if diff == 0 else math.inf
        return float(mpmath.sqrt(diff / norm))


def _evalf(result: Any) -> Any:
    if isinstance(result, (tuple, list)):
        return type(result)(_evalf(part) for part in result)
    return result.evalf(DIGITS) if isinstance(result, (sp.Basic, sp.MatrixBase)) else result


@contextmanager
def forty_digit_intermediates() -> Iterator[None]:
    """While active, every entry's sympy form returns its result evaluated to 40 digits.

    A composite meaning (a block, the whole model) calls the forms of its parts; left
    exact, constants such as √d_k and √(2/π) keep every intermediate symbolic and the
    expressions (and sympy's automatic simplification of them) grow without bound.
    Rounding each part's result to 40 digits evaluates the same source in 40-digit
    arithmetic: its error (~1e-38) is far below the 1e-12 being tested."""
    exact = {entry.id: entry.sympy for entry in REGISTRY}

    def evaluated(form: Callable[..., Any]) -> Callable[..., Any]:
        return lambda *args, **kwargs: _evalf(form(*args, **kwargs))

    try:
        for entry in REGISTRY:
            object.__setattr__(entry, "sympy", evaluated(exact[entry.id]))  # a frozen dataclass
        yield
    finally:
        for entry in REGISTRY:
            object.__setattr__(entry, "sympy", exact[entry.id])


def disagreement(entry: Equation, function: Callable[..., Any], seed: int = 0) -> str | None:
    """How ``function`` (a reference, or a deliberately wrong one) departs from the entry's
    sympy meaning on random inputs; None when it agrees to RTOL in every case."""
    rng = np.random.default_rng(seed)
    for sym_args, ref_args, label in cases(entry, rng):
        with forty_digit_intermediates():
            exact = exact_arrays(entry.sympy(*sym_args))
        try:
            got = reference_arrays(function(*ref_args))
            if len(got) != len(exact):
                return f"{label}: {len(got)} outputs, expected {len(exact)}"
            for k, (g, e) in enumerate(zip(got, exact, strict=True)):
                error = relative_error(g, e)
                if not error <= RTOL:
                    return f"{label}: output {k} has relative error {error:.3g} > {RTOL:g}"
        except AssertionError as err:
            return f"{label}: {err}"
    return None


@pytest.mark.parametrize("entry", forward_entries(), ids=lambda e: e.id)
def test_reference_agrees_with_the_sympy_meaning(entry: Equation) -> None:
    assert entry.sympy_inputs, f"{entry.id} declares no sympy_inputs"
    function = getattr(reference, entry.reference)
    for seed in (0, 1):
        problem = disagreement(entry, function, seed)
        assert problem is None, f"{entry.id} (seed {seed}): {problem}"


def test_every_forward_entry_is_checked() -> None:
    # The forward pass is the four groups; every function of their reference modules is one
    # of their entries, so the parametrised test above covers all of them.
    modules = (embedding, attention, block, output)
    assert sorted(e.id for e in forward_entries()) == sorted(n for m in modules for n in m.__all__)


# --- the spec's own identities, symbolically -----------------------------------------------


def _symbols(name: str, rows: int, cols: int) -> sp.Matrix:
    return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}_{i}{j}", real=True))


def test_softmax_shift_identity_holds_symbolically() -> None:
    z, c = _symbols("z", 1, 3), sp.Symbol("c", real=True)
    shifted = REGISTRY["softmax_shifted"].sympy(z, sp.Matrix([[c]]))
    difference = shifted - REGISTRY["softmax"].sympy(z)
    assert all(sp.simplify(v) == 0 for v in difference)


def test_one_hot_product_is_row_selection_symbolically() -> None:
    W_E = _symbols("w", 5, 3)
    x = [4, 0, 4, 2]
    via_product = REGISTRY["token_embedding_one_hot"].sympy(REGISTRY["one_hot"].sympy(x, 5), W_E)
    assert via_product == REGISTRY["token_embedding"].sympy(x, W_E)


def test_head_sum_equals_concatenation_symbolically() -> None:
    d, h, T = 4, 2, 2
    args = (_symbols("h", T, d), _symbols("w", d, 3 * d), _symbols("b", 1, 3 * d),
            _symbols("o", d, d), _symbols("c", 1, d))
    concat = REGISTRY["multi_head_attention"].sympy(*args, n_heads=h)
    head_sum = REGISTRY["multi_head_attention_head_sum"].sympy(*args, n_heads=h)
    assert all(sp.expand(v) == 0 for v in concat - head_sum)


def test_mask_before_or_after_the_scale_agree_for_a_causal_mask() -> None:
    # The decision recorded on attention_scores: (QKᵀ + M)/√d_k = QKᵀ/√d_k + M when every
    # entry of M is 0 or −∞ (and differs for a finite non-zero M).
    Q, K = _symbols("q", 3, 2), _symbols("k", 3, 2)
    M = REGISTRY["causal_mask"].sympy(3)
    blueprint = (Q * K.T + M) / sp.sqrt(2)
    assert REGISTRY["attention_scores"].sympy(Q, K, M) == blueprint
    finite = _symbols("m", 3, 3)
    assert REGISTRY["attention_scores"].sympy(Q, K, finite) != (Q * K.T + finite) / sp.sqrt(2)


@pytest.mark.parametrize("entry", [e for e in forward_entries() if e.id not in CONFIGS],
                         ids=lambda e: e.id)
def test_sympy_form_is_symbolic(entry: Equation) -> None:
    """Each meaning also runs on matrices of symbols and can be differentiated (the
    gradient entries build on this)."""
    args: list = []
    for k, (_, shape) in enumerate(entry.sympy_inputs):
        if m := re.fullmatch(r"\((.*)\) int < (\w+)", shape):
            args.append([0, size(m[2]) - 1, 1][: dims(m[1])[0]])
        elif m := re.fullmatch(r"int (\w+)", shape):
            args.append(size(m[1]))
        elif shape == "() > 0":
            args.append(sp.Symbol(f"s{k}", positive=True))
        elif m := re.fullmatch(r"\[(\w+)\]\((.*)\)", shape):
            args.append([_symbols(f"a{k}_{i}", *dims(m[2])) for i in range(size(m[1]))])
        elif m := re.fullmatch(r"\((.*)\)( mask)?", shape):
            args.append(_symbols(f"a{k}", *dims(m[1])))
        else:
            raise AssertionError(f"{entry.id}: unknown shape {shape!r}")
    result = entry.sympy(*args)
    parts = list(result) if isinstance(result, (tuple, list)) else [result]
    values = [sp.sympify(v) for part in parts
              for v in (part if isinstance(part, sp.MatrixBase) else [part])]
    last = values[-1]
    if not last.free_symbols:  # one_hot and causal_mask depend only on integers
        assert entry.id in ("one_hot", "causal_mask")
        return
    derivative = sp.diff(last, sorted(last.free_symbols, key=str)[0])
    assert isinstance(derivative, sp.Expr) and derivative != 0


# --- the comparison rejects wrong references -----------------------------------------------


def _softmax_unnormalised(z, axis=-1):
    return np.exp(z)


def _layer_norm_unbiased(x, gamma, beta, eps):
    x = np.asarray(x)
    mu = x.mean(axis=-1, keepdims=True)
    return gamma * (x - mu) / np.sqrt(x.var(axis=-1, ddof=1, keepdims=True) + eps) + beta


def _layer_norm_eps_outside(x, gamma, beta, eps):
    x = np.asarray(x)
    mu = x.mean(axis=-1, keepdims=True)
    return gamma * (x - mu) / (x.std(axis=-1, keepdims=True) + eps) + beta


def _scores_mask_inside(Q, K, M):
    return (Q @ np.swapaxes(K, -1, -2) + M) / math.sqrt(Q.shape[-1])


def _causal_mask_hides_diagonal(T):
    M = np.zeros((T, T))
    M[np.triu_indices(T, k=0)] = -np.inf
    return M


def _split_heads_interleaved(X, n_heads):
    *lead, T, d = X.shape
    return X.reshape(*lead, T, d // n_heads, n_heads).swapaxes(-1, -2).swapaxes(-3, -2)


def _sequence_log_probability_with_x1(tokens, logits):
    log_p = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    return np.take_along_axis(log_p, np.asarray(tokens)[..., None], axis=-1).sum()


def _block_pre_ln_without_second_residual(H, p, config):
    H1 = H + block._attn(block._ln(H, p, "ln_1", config), p, config)
    return block._ffn(block._ln(H1, p, "ln_2", config), p, config)


def _gpt_forward_untied_ignoring_bias(tokens, params, config):
    return output.gpt_forward(tokens, {k: v for k, v in params.items() if k != "b_u"},
                               config.replace(output_bias=False))


def _gpt_forward_reusing_the_first_block(tokens, params, config):
    first = block.block_parameters(params, 0)
    shared = {k: v for k, v in params.items() if not k.startswith("blocks.")}
    for layer in range(config.n_layers):
        shared.update({f"blocks.{layer}.{k}": v for k, v in first.items()})
    return output.gpt_forward(tokens, shared, config)


WRONG = [
    ("softmax", _softmax_unnormalised),
    ("layer_norm", _layer_norm_unbiased),
    ("layer_norm", _layer_norm_eps_outside),
    ("gelu", block.gelu_tanh),
    ("gelu_tanh", block.gelu),
    ("attention_scores", _scores_mask_inside),
    ("causal_mask", _causal_mask_hides_diagonal),
    ("split_heads", _split_heads_interleaved),
    ("unembed_tied", lambda H, W_E: H @ W_E.reshape(W_E.shape[1], W_E.shape[0])),
    ("sequence_log_probability", _sequence_log_probability_with_x1),
    ("block_pre_ln", _block_pre_ln_without_second_residual),
    ("block_post_ln", block.block_pre_ln),
    ("gpt_forward", _gpt_forward_untied_ignoring_bias),
    ("gpt_forward", _gpt_forward_reusing_the_first_block),
]


@pytest.mark.parametrize(("entry_id", "wrong"), WRONG,
                         ids=[f"{i}-{f.__name__}" for i, f in WRONG])
def test_comparison_rejects_a_wrong_reference(entry_id: str, wrong: Callable[..., Any]) -> None:
    assert disagreement(REGISTRY[entry_id], wrong) is not None


def test_comparison_accepts_an_error_within_tolerance_and_rejects_one_beyond() -> None:
    entry = REGISTRY["linear"]
    assert disagreement(entry, lambda x, W, b: attention.linear(x, W, b) * (1 + 1e-14)) is None
    assert disagreement(entry, lambda x, W, b: attention.linear(x, W, b) * (1 + 1e-10)) is not None


def test_exact_side_carries_more_than_double_precision() -> None:
    # 3 × 0.1 rounds in float64; the 40-digit side must see that rounding, or every
    # comparison above would compare float64 with float64.
    exact = exact_arrays(sp.Matrix([[3 * _float(0.1)]]))[0]
    error = relative_error(np.array([[3 * 0.1]]), exact)
    assert 0 < error < 1e-15


@pytest.mark.parametrize("tokens", [[0, 5], [-1, 2], [[1, 7]]])
def test_reference_refuses_token_ids_outside_the_vocabulary(tokens: list) -> None:
    W_E = np.zeros((5, 4))
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        embedding.token_embedding(tokens, W_E)
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        embedding.one_hot(tokens, 5)
