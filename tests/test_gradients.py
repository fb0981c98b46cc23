"""The hand-written backward pass against central finite differences, the sympy gradient
entries against sympy's own derivatives, and the optimizer transcriptions."""

from __future__ import annotations

import numpy as np
import pytest

from gptspec.reference import attention, block, embedding, gradients, output
from gptspec.reference import loss as LOSS
from gptspec.spec.config import GPTConfig
from gptspec.spec.parameters import init_parameters

H_STEP = 1e-6  # central differences: error O(h²) + O(u/h) ≈ 1e-10 relative in float64
REL = 1e-6  # the bound on the relative error


def numerical_gradient(f, x: np.ndarray) -> np.ndarray:
    """∂f/∂x by central differences, one entry at a time (x is perturbed in place)."""
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + H_STEP
        up = f()
        flat[i] = keep - H_STEP
        down = f()
        flat[i] = keep
        gflat[i] = (up - down) / (2 * H_STEP)
    return grad


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    scale = max(np.linalg.norm(a), np.linalg.norm(b))
    return 0.0 if scale == 0 else float(np.linalg.norm(a - b) / scale)


def check_vjp(forward, backward_outputs, inputs: dict, wrt: list[str], seed: int = 0) -> None:
    """For L = Σ G ⊙ forward(inputs), the backward's gradient of each input in ``wrt``
    (in order) equals the finite-difference gradient within REL."""
    rng = np.random.default_rng(seed)
    G = rng.normal(size=np.shape(forward(**inputs)))
    grads = backward_outputs(G)
    assert len(grads) == len(wrt)
    for name, grad in zip(wrt, grads, strict=True):
        fd = numerical_gradient(lambda: float(np.sum(G * forward(**inputs))), inputs[name])
        assert grad.shape == fd.shape, name
        assert relative_error(grad, fd) <= REL, (name, relative_error(grad, fd))


def _rand(rng, *shape):
    return rng.normal(size=shape)


# --- every operation -------------------------------------------------------------------------

def test_linear_backward():
    rng = np.random.default_rng(1)
    inp = {"x": _rand(rng, 2, 3, 4), "W": _rand(rng, 4, 5), "b": _rand(rng, 5)}
    check_vjp(attention.linear, lambda G: gradients.linear_backward(G, inp["x"], inp["W"]), inp,
              ["x", "W", "b"])


def test_token_and_positional_embedding_backward():
    rng = np.random.default_rng(2)
    tokens = np.array([[1, 3, 1], [0, 3, 3]])  # repeated tokens must accumulate
    inp = {"W_E": _rand(rng, 5, 4)}
    check_vjp(lambda W_E: embedding.token_embedding(tokens, W_E),
              lambda G: [gradients.token_embedding_backward(G, tokens, 5)], inp, ["W_E"])
    inp = {"W_P": _rand(rng, 6, 4)}
    check_vjp(lambda W_P: embedding.positional_embedding(3, W_P)[None] + np.zeros((2, 3, 4)),
              lambda G: [gradients.positional_embedding_backward(G, 6)], inp, ["W_P"])


def test_tied_embedding_accumulates_both_uses():
    rng = np.random.default_rng(3)
    tokens = np.array([0, 2, 2, 1])
    inp = {"W_E": _rand(rng, 4, 3)}

    def forward(W_E):  # embed, then unembed with the same matrix
        return output.unembed_tied(embedding.token_embedding(tokens, W_E), W_E)

    def backward(G):
        H = embedding.token_embedding(tokens, inp["W_E"])
        dH, dW_unembed = gradients.unembed_tied_backward(G, H, inp["W_E"])
        dW_embed = gradients.token_embedding_backward(dH, tokens, 4)
        return [gradients.tied_embedding_accumulation(dW_embed, dW_unembed)]

    check_vjp(forward, backward, inp, ["W_E"])


def test_unembed_untied_backward():
    rng = np.random.default_rng(4)
    inp = {"H": _rand(rng, 3, 4), "W_U": _rand(rng, 4, 6), "b_U": _rand(rng, 6)}
    check_vjp(output.unembed_untied, lambda G: gradients.unembed_untied_backward(G, inp["H"], inp["W_U"]),
              inp, ["H", "W_U", "b_U"])


def test_layer_norm_backward():
    rng = np.random.default_rng(5)
    inp = {"x": _rand(rng, 2, 3, 5), "gamma": _rand(rng, 5), "beta": _rand(rng, 5)}
    check_vjp(lambda x, gamma, beta: block.layer_norm(x, gamma, beta, 1e-5),
              lambda G: gradients.layer_norm_backward(G, inp["x"], inp["gamma"], 1e-5),
              inp, ["x", "gamma", "beta"])


def test_softmax_backward():
    rng = np.random.default_rng(6)
    inp = {"z": _rand(rng, 3, 5)}
    check_vjp(attention.softmax, lambda G: [gradients.softmax_backward(G, attention.softmax(inp["z"]))],
              inp, ["z"])


def test_attention_backward():
    rng = np.random.default_rng(7)
    M = attention.causal_mask(4)
    inp = {"Q": _rand(rng, 2, 4, 3), "K": _rand(rng, 2, 4, 3), "V": _rand(rng, 2, 4, 3)}
    check_vjp(lambda Q, K, V: attention.scaled_dot_product_attention(Q, K, V, M),
              lambda G: gradients.scaled_dot_product_attention_backward(G, inp["Q"], inp["K"], inp["V"], M),
              inp, ["Q", "K", "V"])


@pytest.mark.parametrize("d_k", [2, 3], ids=["h*d_k=d", "free-head-width"])
def test_multi_head_attention_backward(d_k):
    rng = np.random.default_rng(8)
    a = 2 * d_k  # h·d_k, d_model = 4
    inp = {"H": _rand(rng, 2, 3, 4), "W_qkv": _rand(rng, 4, 3 * a), "b_qkv": _rand(rng, 3 * a),
           "W_O": _rand(rng, a, 4), "b_O": _rand(rng, 4)}
    check_vjp(lambda **a: attention.multi_head_attention(**a, n_heads=2),
              lambda G: gradients.multi_head_attention_backward(G, **inp, n_heads=2),
              inp, ["H", "W_qkv", "b_qkv", "W_O", "b_O"])


@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh"])
def test_activation_backward(name):
    rng = np.random.default_rng(9)
    inp = {"x": _rand(rng, 3, 4)}
    check_vjp(getattr(block, name), lambda G: [getattr(gradients, f"{name}_backward")(G, inp["x"])],
              inp, ["x"])


@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh", "guide_product"])
def test_ffn_backward(name):
    rng = np.random.default_rng(10)
    d_ff = 4 if name == "guide_product" else 6
    inp = {"x": _rand(rng, 2, 3, 4), "W_1": _rand(rng, 4, d_ff), "b_1": _rand(rng, d_ff),
           "W_2": _rand(rng, d_ff, 4), "b_2": _rand(rng, 4)}
    check_vjp(getattr(block, f"ffn_{name}"), lambda G: getattr(gradients, f"ffn_{name}_backward")(G, **inp),
              inp, ["x", "W_1", "b_1", "W_2", "b_2"])


def test_cross_entropy_gradient():
    rng = np.random.default_rng(11)
    targets = np.array([[1, 0, 4], [2, 2, 3]])
    inp = {"logits": _rand(rng, 2, 3, 5)}
    for reduction, fn in (("mean", LOSS.cross_entropy_mean), ("sum", LOSS.cross_entropy_sum)):
        fd = numerical_gradient(lambda fn=fn: fn(inp["logits"], targets), inp["logits"])
        grad = LOSS.cross_entropy_gradient(inp["logits"], targets, reduction=reduction)
        assert relative_error(grad, fd) <= REL


# --- blocks and the whole model, by parameter name --------------------------------------------

SMALL = dict(vocab_size=7, n_ctx=5, d_model=4, n_layers=2, n_heads=2, d_ff=6)
CONFIGS = {
    "pre": GPTConfig(**SMALL),
    "post": GPTConfig(**SMALL, norm="post", ffn="relu", final_norm=False),
    "guide": GPTConfig(**{**SMALL, "d_ff": 4}, norm="guide", ffn="guide_product",
                       tied_embeddings=False, output_bias=True, final_norm=False),
    "gelu-untied-nobias": GPTConfig(**SMALL, ffn="gelu", tied_embeddings=False,
                                    attn_bias=False, ffn_bias=False),
    "blueprint-free-head-no-wpe": GPTConfig(**SMALL, norm="post", ffn="relu", attn_bias=False,
                                            d_head=3, positional_embedding=False),
}


def _perturbed(config: GPTConfig, seed: int) -> dict:
    """Parameters with every entry random (LayerNorm gains and biases too), so no
    gradient vanishes by symmetry."""
    rng = np.random.default_rng(seed)
    return {k: v + rng.normal(0, 0.3, size=v.shape) for k, v in init_parameters(config, seed).items()}


@pytest.mark.parametrize("norm", ["pre", "post", "guide"])
def test_block_backward(norm):
    config = CONFIGS[norm]
    params = block.block_parameters(_perturbed(config, 12), 0)
    rng = np.random.default_rng(13)
    H = rng.normal(size=(2, 4, config.d_model))
    G = rng.normal(size=H.shape)
    dH, grads = gradients.BLOCK_BACKWARD[norm](G, H, params, config)
    assert set(grads) == set(params)
    loss = lambda: float(np.sum(G * block.BLOCK[norm](H, params, config)))
    assert relative_error(dH, numerical_gradient(loss, H)) <= REL
    for name, p in params.items():
        assert relative_error(grads[name], numerical_gradient(loss, p)) <= REL, name


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_gpt_backward_matches_finite_differences(name):
    config = CONFIGS[name]
    params = _perturbed(config, 14)
    rng = np.random.default_rng(15)
    tokens = rng.integers(0, config.vocab_size, size=(2, 5))
    targets = rng.integers(0, config.vocab_size, size=(2, 5))
    loss, grads = gradients.gpt_backward(tokens, targets, params, config)
    assert list(grads) == list(params)  # every parameter, by schema name, schema order
    assert loss == pytest.approx(LOSS.cross_entropy_mean(output.gpt_forward(tokens, params, config), targets))
    f = lambda: LOSS.cross_entropy_mean(output.gpt_forward(tokens, params, config), targets)
    for pname, p in params.items():
        err = relative_error(grads[pname], numerical_gradient(f, p))
        assert err <= REL, (pname, err)


def test_finite_difference_check_catches_a_planted_bug(monkeypatch):
    """A backward with the LayerNorm mean-subtraction term dropped must fail the check."""
    original = gradients.layer_norm_backward

    def broken(dY, x, gamma, eps):
        dx, dg, db = original(dY, x, gamma, eps)
        return dx + 1e-3 * np.mean(dY * gamma, axis=-1, keepdims=True), dg, db

    monkeypatch.setattr(gradients, "layer_norm_backward", broken)
    config = CONFIGS["pre"]
    params = _perturbed(config, 16)
    tokens = np.array([[1, 2, 3, 4]])
    _, grads = gradients.gpt_backward(tokens, tokens[:, ::-1], params, config)
    f = lambda: LOSS.cross_entropy_mean(output.gpt_forward(tokens, params, config), tokens[:, ::-1])
    assert relative_error(grads["wte"], numerical_gradient(f, params["wte"])) > REL


def test_gpt_backward_refuses_bad_tokens():
    config = CONFIGS["pre"]
    params = init_parameters(config)
    with pytest.raises(ValueError, match="targets"):
        gradients.gpt_backward(np.array([[1, 2]]), np.array([[1, 7]]), params, config)
    with pytest.raises(ValueError, match="n_ctx"):
        gradients.gpt_backward(np.zeros((1, 6), int), np.zeros((1, 6), int), params, config)


# --- the sympy gradient entries equal sympy's derivative of the forward forms -------------------

import sympy as sp  # noqa: E402

from gptspec.spec import REGISTRY  # noqa: E402

DIGITS = 30


def sym(name: str, rows: int, cols: int) -> sp.Matrix:
    return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}_{i}_{j}", real=True))


def numeric_values(matrices, seed: int) -> dict:
    """Random values, away from 0 so that no ReLU sits on its kink."""
    rng = np.random.default_rng(seed)
    values = {}
    for m in matrices:
        for s in m.free_symbols:
            x = rng.uniform(0.2, 1.2) * rng.choice([-1, 1])
            values[s] = sp.Float(x, DIGITS)
    return values


def evaluate(m, values: dict) -> np.ndarray:
    m = m if isinstance(m, sp.MatrixBase) else sp.Matrix([[m]])
    return np.array([[float(sp.N(e.xreplace(values), DIGITS)) for e in row]
                     for row in m.tolist()], dtype=np.float64)


def derivative(L, U: sp.Matrix) -> sp.Matrix:
    """sympy's ∂L/∂U, entry by entry."""
    return U.applyfunc(lambda u: sp.diff(L, u))


def pairing(G: sp.Matrix, Y: sp.Matrix):
    """L = Σ G ⊙ Y: its derivative with respect to an input is the VJP with cotangent G."""
    return sum(G.multiply_elementwise(Y))


def assert_entry_matches(grads, expected, values):
    assert len(grads) == len(expected)
    for got, want in zip(grads, expected, strict=True):
        a, b = evaluate(got, values), evaluate(want, values)
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


# The forward entries' sympy forms: the gradients are checked against their derivatives.
def fwd(entry_id: str):
    return REGISTRY[entry_id].sympy


def f_causal_mask(T):
    return REGISTRY["causal_mask"].sympy(T)



def test_every_gradient_entry_has_a_sympy_check():
    checked = {"linear_backward", "token_embedding_backward", "positional_embedding_backward",
               "input_representation_backward", "tied_embedding_accumulation",
               "unembed_tied_backward", "unembed_untied_backward", "layer_norm_backward",
               "softmax_backward", "scaled_dot_product_attention_backward",
               "multi_head_attention_backward", "relu_backward", "gelu_backward",
               "gelu_tanh_backward", "ffn_relu_backward", "ffn_gelu_backward",
               "ffn_gelu_tanh_backward", "ffn_guide_product_backward", "residual_backward"}
    # The block entries compose the entries above; their reference functions are checked
    # against finite differences (test_block_backward), not symbolically (too slow).
    composed = {"block_pre_ln_backward", "block_post_ln_backward", "block_guide_backward",
                "gpt_backward"}
    assert {e.id for e in REGISTRY.by_group("gradients")} == checked | composed


def test_sympy_linear_and_embeddings():
    x, W, b, G = sym("x", 2, 3), sym("W", 3, 2), sym("b", 1, 2), sym("G", 2, 2)
    vals = numeric_values([x, W, b, G], 1)
    L = pairing(G, fwd("linear")(x, W, b))
    assert_entry_matches(REGISTRY["linear_backward"].sympy(G, x, W),
                         [derivative(L, U) for U in (x, W, b)], vals)

    X = sp.Matrix([[0, 1, 0], [0, 1, 0]])  # one token twice: the gradients accumulate
    W_E, GE = sym("W_E", 3, 2), sym("GE", 2, 2)
    vals = numeric_values([W_E, GE], 2)
    assert_entry_matches([REGISTRY["token_embedding_backward"].sympy(GE, X)],
                         [derivative(pairing(GE, fwd("token_embedding_one_hot")(X, W_E)), W_E)], vals)

    W_P = sym("W_P", 3, 2)
    vals = numeric_values([W_P, GE], 3)
    assert_entry_matches([REGISTRY["positional_embedding_backward"].sympy(GE, W_P)],
                         [derivative(pairing(GE, fwd("positional_embedding")(2, W_P)), W_P)], vals)

    E, P = sym("E", 2, 2), sym("P", 2, 2)
    vals = numeric_values([E, P, GE], 4)
    L = pairing(GE, fwd("input_representation")(E, P))
    assert_entry_matches(REGISTRY["input_representation_backward"].sympy(GE),
                         [derivative(L, E), derivative(L, P)], vals)

    GZ, H = sym("GZ", 2, 3), sym("H", 2, 2)
    vals = numeric_values([GZ, H, W_E], 5)
    L = pairing(GZ, fwd("unembed_tied")(H, W_E))
    assert_entry_matches(REGISTRY["unembed_tied_backward"].sympy(GZ, H, W_E),
                         [derivative(L, H), derivative(L, W_E)], vals)
    # Tied: embed then unembed with the same matrix; W_E's gradient is both uses summed.
    L = pairing(GZ, fwd("unembed_tied")(fwd("token_embedding_one_hot")(X, W_E), W_E))
    assert_entry_matches([REGISTRY["tied_embedding_accumulation"].sympy(X, GZ * W_E, GZ, X * W_E)],
                         [derivative(L, W_E)], vals)

    W_U, b_U = sym("W_U", 2, 3), sym("b_U", 1, 3)
    vals = numeric_values([GZ, H, W_U, b_U], 6)
    L = pairing(GZ, fwd("unembed_untied")(H, W_U, b_U))
    assert_entry_matches(REGISTRY["unembed_untied_backward"].sympy(GZ, H, W_U),
                         [derivative(L, U) for U in (H, W_U, b_U)], vals)


def test_sympy_layer_norm_and_softmax():
    x, gamma, beta, G = sym("x", 2, 3), sym("g", 1, 3), sym("b", 1, 3), sym("G", 2, 3)
    eps = sp.Rational(1, 10**5)
    vals = numeric_values([x, gamma, beta, G], 7)
    L = pairing(G, fwd("layer_norm")(x, gamma, beta, eps))
    assert_entry_matches(REGISTRY["layer_norm_backward"].sympy(G, x, gamma, eps=eps),
                         [derivative(L, U) for U in (x, gamma, beta)], vals)

    z = sym("z", 2, 3)
    vals = numeric_values([z, G], 8)
    assert_entry_matches([REGISTRY["softmax_backward"].sympy(G, fwd("softmax")(z))],
                         [derivative(pairing(G, fwd("softmax")(z)), z)], vals)


def test_sympy_attention():
    Q, K, V, G = sym("Q", 3, 2), sym("K", 3, 2), sym("V", 3, 2), sym("G", 3, 2)
    M = f_causal_mask(3)
    vals = numeric_values([Q, K, V, G], 9)
    L = pairing(G, fwd("scaled_dot_product_attention")(Q, K, V, M))
    assert_entry_matches(REGISTRY["scaled_dot_product_attention_backward"].sympy(G, Q, K, V, M),
                         [derivative(L, U) for U in (Q, K, V)], vals)

    # h·d_k = 4 ≠ d_model = 2: the free head width (W_O maps h·d_k back to d_model)
    H, W_qkv, b_qkv = sym("H", 2, 2), sym("Wqkv", 2, 12), sym("bqkv", 1, 12)
    W_O, b_O, G = sym("WO", 4, 2), sym("bO", 1, 2), sym("G", 2, 2)
    vals = numeric_values([H, W_qkv, b_qkv, W_O, b_O, G], 10)
    L = pairing(G, fwd("multi_head_attention")(H, W_qkv, b_qkv, W_O, b_O, 2))
    assert_entry_matches(
        REGISTRY["multi_head_attention_backward"].sympy(G, H, W_qkv, b_qkv, W_O, b_O, n_heads=2),
        [derivative(L, U) for U in (H, W_qkv, b_qkv, W_O, b_O)], vals)


@pytest.mark.parametrize("kind", ["relu", "gelu", "gelu_tanh"])
def test_sympy_activations(kind):
    x, G = sym("x", 1, 3), sym("G", 1, 3)
    vals = numeric_values([x, G], 11)
    assert_entry_matches([REGISTRY[f"{kind}_backward"].sympy(G, x)],
                         [derivative(pairing(G, fwd(kind)(x)), x)], vals)


@pytest.mark.parametrize("kind", ["relu", "gelu", "gelu_tanh", "guide_product"])
def test_sympy_ffn(kind):
    f = 2 if kind == "guide_product" else 3
    x, W_1, b_1 = sym("x", 2, 2), sym("W1", 2, f), sym("b1", 1, f)
    W_2, b_2, G = sym("W2", 2 if kind == "guide_product" else f, 2), sym("b2", 1, 2), sym("G", 2, 2)
    vals = numeric_values([x, W_1, b_1, W_2, b_2, G], 12)
    L = pairing(G, fwd(f"ffn_{kind}")(x, W_1, b_1, W_2, b_2))
    assert_entry_matches(REGISTRY[f"ffn_{kind}_backward"].sympy(G, x, W_1, b_1, W_2, b_2),
                         [derivative(L, U) for U in (x, W_1, b_1, W_2, b_2)], vals)


def test_sympy_residual():
    x, W, G = sym("x", 2, 2), sym("W", 2, 2), sym("G", 2, 2)
    vals = numeric_values([x, W, G], 13)
    branch = lambda v: (v * W).applyfunc(sp.tanh)
    through_branch = derivative(pairing(G, branch(x)), x)
    assert_entry_matches([REGISTRY["residual_backward"].sympy(G, through_branch)],
                         [derivative(pairing(G, x + branch(x)), x)], vals)


def _sym_block(config: GPTConfig) -> dict:
    from gptspec.spec.parameters import parameter_schema
    p = {}
    for s in parameter_schema(config):
        if s.name.startswith("blocks.0."):
            name = s.name[len("blocks.0."):]
            shape = s.shape if len(s.shape) == 2 else (1, s.shape[0])
            p[name] = sym(name.replace(".", "_"), *shape)
    return p


def test_sympy_cross_entropy():
    Z = sym("Z", 2, 3)
    Y = sp.Matrix([[0, 1, 0], [0, 0, 1]])
    vals = numeric_values([Z], 15)
    L = REGISTRY["cross_entropy_sum"].sympy(Z, Y)
    assert_entry_matches([REGISTRY["cross_entropy_gradient"].sympy(Z, Y)], [derivative(L, Z)], vals)
    L = REGISTRY["cross_entropy_mean"].sympy(Z, Y)
    assert_entry_matches([REGISTRY["cross_entropy_gradient"].sympy(Z, Y, reduction="mean")],
                         [derivative(L, Z)], vals)


def test_sympy_check_catches_a_planted_bug():
    """A softmax backward missing its a aᵀ term must not pass the comparison."""
    z, G = sym("z", 1, 3), sym("G", 1, 3)
    vals = numeric_values([z, G], 16)
    A = fwd("softmax")(z)
    wrong = A.multiply_elementwise(G)
    with pytest.raises(AssertionError):
        assert_entry_matches([wrong], [derivative(pairing(G, A), z)], vals)


def test_loss_references_equal_their_spec_entries():
    rng = np.random.default_rng(17)
    Z = rng.normal(size=(3, 4))
    y = np.array([1, 3, 0])
    Zs = sp.Matrix(Z.tolist()).applyfunc(lambda v: sp.Float(v, DIGITS))
    Ys = sp.Matrix(3, 4, lambda t, v: 1 if y[t] == v else 0)
    assert LOSS.cross_entropy_sum(Z, y) == pytest.approx(
        float(REGISTRY["cross_entropy_sum"].sympy(Zs, Ys)), rel=1e-14)
    assert LOSS.cross_entropy_mean(Z, y) == pytest.approx(
        float(REGISTRY["cross_entropy_mean"].sympy(Zs, Ys)), rel=1e-14)
    for reduction in ("sum", "mean"):
        np.testing.assert_allclose(
            LOSS.cross_entropy_gradient(Z, y, reduction=reduction),
            evaluate(REGISTRY["cross_entropy_gradient"].sympy(Zs, Ys, reduction=reduction), {}),
            rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(LOSS.log_softmax(Z[:1]),
                               evaluate(REGISTRY["log_softmax"].sympy(Zs[0, :]), {}), rtol=1e-14)
