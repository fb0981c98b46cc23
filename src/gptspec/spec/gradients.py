"""Spec entries: the backward equation of every forward operation.

Each entry is a vector-Jacobian product. For a forward map y = f(a, b, …) and a scalar
loss L, its sympy form takes G = ∂L/∂y (the shape of y) and the forward inputs, and
returns (∂L/∂a, ∂L/∂b, …): for every input u, ∂L/∂u_i = Σ_j G_j ∂y_j/∂u_i. The entry
``<op>_backward`` is the backward equation of the forward entry ``<op>``; the test suite
checks each against sympy's own derivative of the forward entry's sympy form.

Row vectors, as in the forward pass: a sequence is a (T, d) matrix, a bias a (1, n)
row added to every row. A parameter used by every row (a weight, a bias, a LayerNorm
gain) receives the sum over the rows.
"""

from __future__ import annotations

import sympy as sp

from gptspec.spec.equation import Decision, Reading, Symbol, Tolerance, equation
from gptspec.spec.sources import BLUEPRINT, GUIDE, NOTES, Source

G_SYMBOL = Symbol("G", "shape of the output", r"upstream gradient \partial L / \partial y")
SUM_ROWS = Tolerance(r"\lambda \sqrt{N}\,u", reduction="T",
                     note="weight and bias gradients sum over the T rows (B T in a batch)")


DEFAULT_EPS = sp.Rational(1, 100000)


def _ones_row(n: int):
    return sp.ones(1, n)


def _sum_rows(G):
    """Σ_t G[t, :] as a (1, n) row: the gradient of a parameter shared by every row."""
    return _ones_row(G.rows) * G


def _hadamard(A, B):
    return A.multiply_elementwise(B)


def _add_row(X, b):
    return X if b is None else X + sp.ones(X.rows, 1) * b


def _softmax_rows(S):
    rows = []
    for t in range(S.rows):
        e = S[t, :].applyfunc(sp.exp)
        rows.append(e / sum(e))
    return sp.Matrix.vstack(*rows)


def _causal_mask(T: int):
    return sp.Matrix(T, T, lambda i, j: 0 if j <= i else -sp.oo)


# --- linear maps and embeddings ------------------------------------------------------------------


@equation(
    id="linear_backward",
    title="Backward of a linear map",
    group="gradients",
    latex=r"y = xW + b:\quad \frac{\partial L}{\partial x} = G W^\top,\quad "
          r"\frac{\partial L}{\partial W} = x^\top G,\quad "
          r"\frac{\partial L}{\partial b} = \textstyle\sum_t G_{t,:}",
    symbols=(G_SYMBOL, Symbol("x", "(T, n)", "input rows of n features"),
             Symbol("W", "(n, m)", "weight, n features in, m out"), Symbol("b", "(m,)", "bias"),
             Symbol("y", "(T, m)", "output rows")),
    sources=(Source(BLUEPRINT, "eq 2"), Source(BLUEPRINT, "eq 6")),
    reference="linear_backward",
    tolerance=SUM_ROWS,
    sympy_inputs=(("G", "(T, m)"), ("x", "(T, n)"), ("W", "(n, m)")),
)
def linear_backward(G, x, W):
    return G * W.T, x.T * G, _sum_rows(G)


@equation(
    id="token_embedding_backward",
    title="Backward of the token embedding",
    group="gradients",
    latex=r"E = X W_E:\quad \frac{\partial L}{\partial W_E} = X^\top G,\ \text{i.e. row } v "
          r"\text{ of the gradient is } \textstyle\sum_{t : x_t = v} G_{t,:}",
    symbols=(G_SYMBOL, Symbol("X", "(T, V)", "one-hot rows of the tokens"),
             Symbol("x", "(T,)", "the token ids: x_t is the id at position t"),
             Symbol("W_E", "(V, d_model)", "token embedding matrix (wte)"),
             Symbol("E", "(T, d_model)", "token embeddings")),
    sources=(Source(NOTES, "embedding"), Source(BLUEPRINT, "sec. 2.1")),
    reference="token_embedding_backward",
    tolerance=Tolerance("0", reduction="T",
                        note="a scatter-add of exact copies; exact up to the order of the sum"),
    notes="The reference computes Xᵀ G as a scatter-add by token id (it takes the ids, not "
          "the one-hot matrix); a token that occurs twice receives both gradients.",
    sympy_inputs=(("G", "(T, d)"), ("X", "(T, V)")),
)
def token_embedding_backward(G, X):
    return X.T * G


@equation(
    id="positional_embedding_backward",
    title="Backward of the learned positional embedding",
    group="gradients",
    latex=r"P = (W_P)_{1:T,:}:\quad \frac{\partial L}{\partial (W_P)_{t,:}} = G_{t,:} \ (t \le T),"
          r"\quad 0 \ (t > T)",
    symbols=(G_SYMBOL, Symbol("W_P", "(n_ctx, d_model)", "positional embedding; row t is "
                              "position t"),
             Symbol("P", "(T, d_model)", "the positional rows of a sequence of length T")),
    sources=(Source(BLUEPRINT, "sec. 2.1"),),
    reference="positional_embedding_backward",
    tolerance=Tolerance("0", reduction="B", note="a sum over the batch"),
    notes="In a batch every sequence uses the same rows, so their gradients add up.",
    sympy_inputs=(("G", "(T, d)"), ("W_P", "(n_ctx, d)")),
)
def positional_embedding_backward(G, W_P):
    return sp.Matrix(W_P.rows, W_P.cols, lambda t, i: G[t, i] if t < G.rows else 0)


@equation(
    id="input_representation_backward",
    title="Backward of the input representation",
    group="gradients",
    latex=r"H^{(0)} = E + P:\quad \frac{\partial L}{\partial E} = G,\quad "
          r"\frac{\partial L}{\partial P} = G",
    symbols=(G_SYMBOL, Symbol("E", "(T, d_model)", "token embeddings"),
             Symbol("P", "(T, d_model)", "positional embeddings"),
             Symbol("H^{(0)}", "(T, d_model)", "the residual stream entering the first block")),
    sources=(Source(BLUEPRINT, "sec. 2.1"),),
    reference="input_representation_backward",
    sympy_inputs=(("G", "(T, d)"),),
)
def input_representation_backward(G):
    return G, G


@equation(
    id="tied_embedding_accumulation",
    title="Gradient of a tied embedding: both uses add up",
    group="gradients",
    latex=r"W_U = W_E^\top:\quad \frac{\partial L}{\partial W_E} = X^\top "
          r"\frac{\partial L}{\partial E} + \left(\frac{\partial L}{\partial Z}\right)^{\!\top} H_f",
    symbols=(
        Symbol("X", "(T, V)", "one-hot tokens"),
        Symbol("E", "(T, d_model)", "the embedding's output; ∂L/∂E the gradient reaching it"),
        Symbol("Z", "(T, V)", "the logits; ∂L/∂Z their gradient"),
        Symbol("H_f", "(T, d_model)", "the last hidden states, input of the unembedding"),
        Symbol("W_E", "(V, d_model)", "token embedding, the one matrix of both uses"),
        Symbol("W_U", "(d_model, V)", "the unembedding, here W_E transposed"),
    ),
    sources=(Source(BLUEPRINT, "eq 9"), Source(NOTES, "embedding and unembedding")),
    reference="tied_embedding_accumulation",
    tolerance=SUM_ROWS,
    decisions=(
        Decision(
            question="Is the output map the embedding transposed (one matrix) or its own matrix?",
            readings=(Reading(Source(BLUEPRINT, "eq 9"), r"logits $= h W_E^\top$ (tied)"),
                      Reading(Source(GUIDE, "sec. 6"), "its own W and b (untied)")),
            decision="Both, by config.tied_embeddings; when tied, the one matrix receives "
                     "the sum of the gradients of its two uses.",
            why="A parameter used twice is differentiated by the product rule: the total "
                "derivative is the sum over its uses.",
        ),
    ),
    notes="The reference takes the two contributions already formed (token_embedding_backward "
          "and unembed_tied_backward) and adds them.",
    sympy_inputs=(("X", "(T, V)"), ("G_E", "(T, d)"), ("G_Z", "(T, V)"), ("H_f", "(T, d)")),
)
def tied_embedding_accumulation(X, G_E, G_Z, H_f):
    return X.T * G_E + G_Z.T * H_f


@equation(
    id="unembed_tied_backward",
    title="Backward of the tied unembedding",
    group="gradients",
    latex=r"Z = H W_E^\top:\quad \frac{\partial L}{\partial H} = G W_E,\quad "
          r"\frac{\partial L}{\partial W_E}\Big|_{\text{output}} = G^\top H",
    symbols=(G_SYMBOL, Symbol("H", "(T, d_model)", "last hidden states"),
             Symbol("W_E", "(V, d_model)", "token embedding"),
             Symbol("Z", "(T, V)", "logits")),
    sources=(Source(BLUEPRINT, "eq 9"),),
    reference="unembed_tied_backward",
    tolerance=SUM_ROWS,
    sympy_inputs=(("G", "(T, V)"), ("H", "(T, d)"), ("W_E", "(V, d)")),
)
def unembed_tied_backward(G, H, W_E):
    return G * W_E, G.T * H


@equation(
    id="unembed_untied_backward",
    title="Backward of the untied unembedding",
    group="gradients",
    latex=r"Z = H W_U + b_U:\quad \frac{\partial L}{\partial H} = G W_U^\top,\quad "
          r"\frac{\partial L}{\partial W_U} = H^\top G,\quad "
          r"\frac{\partial L}{\partial b_U} = \textstyle\sum_t G_{t,:}",
    symbols=(G_SYMBOL, Symbol("H", "(T, d_model)", "last hidden states"),
             Symbol("W_U", "(d_model, V)", "unembedding"), Symbol("b_U", "(V,)", "its bias"),
             Symbol("Z", "(T, V)", "logits")),
    sources=(Source(GUIDE, "sec. 6"),),
    reference="unembed_untied_backward",
    tolerance=SUM_ROWS,
    sympy_inputs=(("G", "(T, V)"), ("H", "(T, d)"), ("W_U", "(d, V)")),
)
def unembed_untied_backward(G, H, W_U):
    return linear_backward.sympy(G, H, W_U)


# --- normalisation, softmax, attention --------------------------------------------------------------


@equation(
    id="layer_norm_backward",
    title="Backward of LayerNorm",
    group="gradients",
    latex=r"y = \gamma \odot \hat{x} + \beta,\ \hat{x} = \frac{x - \mu}{\sigma},\ "
          r"\sigma = \sqrt{\operatorname{var}(x) + \varepsilon}:\quad "
          r"\frac{\partial L}{\partial x} = \frac{1}{\sigma}\left(g - \bar{g} - "
          r"\hat{x}\,\overline{g \odot \hat{x}}\right),\ g = G \odot \gamma;\quad "
          r"\frac{\partial L}{\partial \gamma} = \textstyle\sum_t G_t \odot \hat{x}_t,\ "
          r"\frac{\partial L}{\partial \beta} = \sum_t G_t",
    symbols=(G_SYMBOL, Symbol("x", "(T, n)", "input rows"), Symbol(r"\gamma", "(n,)", "gain"),
             Symbol(r"\beta", "(n,)", "bias"), Symbol(r"\varepsilon", "()", "variance floor"),
             Symbol("y", "(T, n)", "output rows"),
             Symbol(r"\mu", "(T,)", "each row's mean"),
             Symbol(r"\sigma", "(T,)", "each row's standard deviation, with the floor"),
             Symbol("g", "(T, n)", "the upstream gradient through the gain")),
    sources=(Source(BLUEPRINT, "eq 7"), Source(NOTES, "layer norm")),
    reference="layer_norm_backward",
    tolerance=Tolerance(r"\lambda \sqrt{n}\,u\,\kappa", reduction="n",
                        note="the bars are means over the n entries of a row"),
    notes="μ and σ depend on every entry of the row, which gives the two subtracted terms: "
          "the mean of g (through μ) and the projection on x̂ (through σ).",
    sympy_inputs=(("G", "(T, n)"), ("x", "(T, n)"), ("gamma", "(1, n)")),
)
def layer_norm_backward(G, x, gamma, eps=DEFAULT_EPS):
    n = x.cols
    dx_rows, xhat_rows = [], []
    for t in range(x.rows):
        row = x[t, :]
        mu = sum(row) / n
        sigma = sp.sqrt(sum((xi - mu) ** 2 for xi in row) / n + eps)
        xhat = (row - mu * _ones_row(n)) / sigma
        g = _hadamard(G[t, :], gamma)
        g_mean = sum(g) / n
        gx_mean = sum(_hadamard(g, xhat)) / n
        dx_rows.append((g - g_mean * _ones_row(n) - gx_mean * xhat) / sigma)
        xhat_rows.append(xhat)
    xhat_all = sp.Matrix.vstack(*xhat_rows)
    return sp.Matrix.vstack(*dx_rows), _sum_rows(_hadamard(G, xhat_all)), _sum_rows(G)


@equation(
    id="softmax_backward",
    title="Backward of softmax",
    group="gradients",
    latex=r"a = \operatorname{softmax}(z):\quad \frac{\partial L}{\partial z} = "
          r"a \odot \left(G - \textstyle\sum_j a_j G_j\right) = "
          r"\left(\operatorname{diag}(a) - a a^\top\right) G",
    symbols=(G_SYMBOL, Symbol("z", "(n,)", "the scores"), Symbol("a", "(n,)", "the softmax output")),
    sources=(Source(BLUEPRINT, "eq 3"),),
    reference="softmax_backward",
    tolerance=Tolerance(r"\lambda \sqrt{n}\,u", reduction="n"),
    notes="Written in terms of the output a, which the forward pass already holds.",
    sympy_inputs=(("G", "(1, n)"), ("A", "(1, n)")),
)
def softmax_backward(G, A):
    rows = []
    for t in range(A.rows):
        inner = sum(_hadamard(G[t, :], A[t, :]))
        rows.append(_hadamard(A[t, :], G[t, :] - inner * _ones_row(A.cols)))
    return sp.Matrix.vstack(*rows)


def _attention_backward(G, Q, K, V, M):
    scale = 1 / sp.sqrt(Q.cols)
    A = _softmax_rows(Q * K.T * scale + M)
    dS = softmax_backward.sympy(G * V.T, A)
    return dS * K * scale, dS.T * Q * scale, A.T * G


@equation(
    id="scaled_dot_product_attention_backward",
    title="Backward of scaled dot-product attention",
    group="gradients",
    latex=r"O = A V,\ A = \operatorname{softmax}(S),\ S = \frac{QK^\top}{\sqrt{d_k}} + M:\quad "
          r"\frac{\partial L}{\partial V} = A^\top G,\ "
          r"\frac{\partial L}{\partial S} = \operatorname{softmax\_backward}(G V^\top, A),\ "
          r"\frac{\partial L}{\partial Q} = \frac{1}{\sqrt{d_k}} \frac{\partial L}{\partial S} K,\ "
          r"\frac{\partial L}{\partial K} = \frac{1}{\sqrt{d_k}} "
          r"\left(\frac{\partial L}{\partial S}\right)^{\!\top} Q",
    symbols=(G_SYMBOL, Symbol("Q", "(T, d_k)", "queries"), Symbol("K", "(T, d_k)", "keys"),
             Symbol("V", "(T, d_k)", "values"), Symbol("M", "(T, T)", "causal mask"),
             Symbol("S", "(T, T)", "scaled, masked scores"), Symbol("A", "(T, T)", "attention weights"),
             Symbol("O", "(T, d_k)", "output")),
    sources=(Source(BLUEPRINT, "eq 3"), Source(NOTES, "attention")),
    reference="scaled_dot_product_attention_backward",
    tolerance=Tolerance(r"\lambda \sqrt{T}\,u", reduction="T"),
    notes="A masked score has a = 0, so softmax_backward sends it no gradient: the mask is "
          "respected by the backward pass without being applied again.",
    sympy_inputs=(("G", "(T, k)"), ("Q", "(T, k)"), ("K", "(T, k)"), ("V", "(T, k)"),
                  ("M", "(T, T)")),
)
def scaled_dot_product_attention_backward(G, Q, K, V, M):
    return _attention_backward(G, Q, K, V, M)


@equation(
    id="multi_head_attention_backward",
    title="Backward of multi-head attention",
    group="gradients",
    latex=r"\text{MultiHead}(H) = C\,W_O + b_O,\ "
          r"[Q \mid K \mid V] = H W_{qkv} + b_{qkv},\ C = [\text{head}_1 \mid \dots \mid "
          r"\text{head}_h]:\quad \frac{\partial L}{\partial C} = G W_O^\top,\ "
          r"\frac{\partial L}{\partial [Q \mid K \mid V]} = [\partial Q_1 \dots \partial Q_h \mid "
          r"\partial K_1 \dots \mid \partial V_1 \dots],\ "
          r"\frac{\partial L}{\partial H} = \frac{\partial L}{\partial [Q \mid K \mid V]} W_{qkv}^\top",
    symbols=(G_SYMBOL, Symbol("H", "(T, d_model)", "input rows"),
             Symbol("W_{qkv}", "(d_model, 3 h d_k)", "[W_Q | W_K | W_V]"),
             Symbol("b_{qkv}", "(3 h d_k,)", "their biases"),
             Symbol("W_O", "(h d_k, d_model)", "output map"), Symbol("b_O", "(d_model,)", "bias"),
             Symbol("Q", "(T, h d_k)", "all heads' queries; Q_i the columns of head i"),
             Symbol("K", "(T, h d_k)", "all heads' keys; K_i those of head i"),
             Symbol("V", "(T, h d_k)", "all heads' values; V_i those of head i"),
             Symbol("C", "(T, h d_k)", "the heads' outputs side by side")),
    sources=(Source(BLUEPRINT, "eq 4"), Source(BLUEPRINT, "eq 5")),
    reference="multi_head_attention_backward",
    tolerance=Tolerance(r"\lambda \sqrt{T d}\,u", reduction="T * d"),
    notes="Returns (∂H, ∂W_qkv, ∂b_qkv, ∂W_O, ∂b_O): the output linear map, each head's "
          "attention backward on its columns, then the Q/K/V linear map, in reverse order.",
    sympy_inputs=(("G", "(T, d)"), ("H", "(T, d)"), ("W_qkv", "(d, 3 * h * k)"),
                  ("b_qkv", "(1, 3 * h * k)"), ("W_O", "(h * k, d)"), ("b_O", "(1, d)")),
)
def multi_head_attention_backward(G, H, W_qkv, b_qkv, W_O, b_O, n_heads=1):
    d = W_O.rows  # h·d_k: each of Q, K, V is this wide (d_model unless the head width is free)
    dk = d // n_heads
    QKV = _add_row(H * W_qkv, b_qkv)
    M = _causal_mask(H.rows)
    heads, grads = [], []
    for i in range(n_heads):
        Q, K, V = (QKV[:, j * d + i * dk: j * d + (i + 1) * dk] for j in range(3))
        heads.append(_softmax_rows(Q * K.T / sp.sqrt(dk) + M) * V)
    C = sp.Matrix.hstack(*heads)
    dC, dW_O, db_O = linear_backward.sympy(G, C, W_O)
    for i in range(n_heads):
        Q, K, V = (QKV[:, j * d + i * dk: j * d + (i + 1) * dk] for j in range(3))
        grads.append(_attention_backward(dC[:, i * dk:(i + 1) * dk], Q, K, V, M))
    dQKV = sp.Matrix.hstack(*[g[j] for j in range(3) for g in grads])
    dH, dW_qkv, db_qkv = linear_backward.sympy(dQKV, H, W_qkv)
    return dH, dW_qkv, db_qkv, dW_O, db_O


# --- activations and feed-forward ------------------------------------------------------------------


def _relu_prime(x):
    return sp.Heaviside(x, 0)


def _gelu(x):
    return x * (1 + sp.erf(x / sp.sqrt(2))) / 2


def _gelu_prime(x):
    return (1 + sp.erf(x / sp.sqrt(2))) / 2 + x * sp.exp(-x**2 / 2) / sp.sqrt(2 * sp.pi)


_C = sp.sqrt(2 / sp.pi)
_A = sp.Rational(44715, 1000000)


def _gelu_tanh(x):
    return x * (1 + sp.tanh(_C * (x + _A * x**3))) / 2


def _gelu_tanh_prime(x):
    t = sp.tanh(_C * (x + _A * x**3))
    return (1 + t) / 2 + x * (1 - t**2) * _C * (1 + 3 * _A * x**2) / 2


ACTIVATIONS = {
    "relu": (lambda x: sp.Max(0, x), _relu_prime),
    "gelu": (_gelu, _gelu_prime),
    "gelu_tanh": (_gelu_tanh, _gelu_tanh_prime),
}


def _elementwise_backward(G, x, prime):
    return _hadamard(G, x.applyfunc(prime))


@equation(
    id="relu_backward",
    title="Backward of ReLU",
    group="gradients",
    latex=r"\frac{\partial L}{\partial x} = G \odot \mathbf{1}[x > 0]",
    symbols=(G_SYMBOL, Symbol("x", "(n,)", "input")),
    sources=(Source(BLUEPRINT, "eq 6"),),
    reference="relu_backward",
    tolerance=Tolerance("0", reduction="1"),
    decisions=(
        Decision(
            question="What is the derivative of max(0, x) at x = 0?",
            readings=(Reading(Source(BLUEPRINT, "eq 6"), "max(0, ·), and says nothing of its derivative"),),
            decision="0 (a subgradient), the value every framework uses.",
            why="Any value in [0, 1] is a subgradient; 0 makes backends agree bit for bit.",
        ),
    ),
    sympy_inputs=(("G", "(1, n)"), ("x", "(1, n)")),
)
def relu_backward(G, x):
    return _elementwise_backward(G, x, _relu_prime)


@equation(
    id="gelu_backward",
    title="Backward of GELU",
    group="gradients",
    latex=r"\frac{\partial L}{\partial x} = G \odot \frac{d}{dx}\, x\Phi(x) "
          r"= G \odot \bigl(\Phi(x) + x\,\varphi(x)\bigr)",
    symbols=(G_SYMBOL, Symbol("x", "(n,)", "input"),
             Symbol(r"\Phi", "()", "the standard normal distribution function, elementwise"),
             Symbol(r"\varphi", "()", "the standard normal density, elementwise")),
    sources=(Source(BLUEPRINT, "eq 6"),),
    reference="gelu_backward",
    tolerance=Tolerance(r"\lambda u", reduction="1"),
    sympy_inputs=(("G", "(1, n)"), ("x", "(1, n)")),
)
def gelu_backward(G, x):
    return _elementwise_backward(G, x, _gelu_prime)


@equation(
    id="gelu_tanh_backward",
    title="Backward of the tanh approximation of GELU",
    group="gradients",
    latex=r"\frac{\partial L}{\partial x} = G \odot \frac{d}{dx}\,\tfrac12 x(1 + \tanh u) "
          r"= G \odot \bigl(\tfrac12(1 + \tanh u) + "
          r"\tfrac12 x (1 - \tanh^2 u)\sqrt{2/\pi}\,(1 + 3 \cdot 0.044715\,x^2)\bigr),\ "
          r"u = \sqrt{2/\pi}\,(x + 0.044715\,x^3)",
    symbols=(G_SYMBOL, Symbol("x", "(n,)", "input"),
             Symbol("u", "(n,)", "the argument of tanh, elementwise")),
    sources=(Source(BLUEPRINT, "eq 6"),),
    reference="gelu_tanh_backward",
    tolerance=Tolerance(r"\lambda u", reduction="1"),
    sympy_inputs=(("G", "(1, n)"), ("x", "(1, n)")),
)
def gelu_tanh_backward(G, x):
    return _elementwise_backward(G, x, _gelu_tanh_prime)


def _ffn_backward(G, x, W_1, b_1, W_2, act: str):
    f, prime = ACTIVATIONS[act]
    pre = _add_row(x * W_1, b_1)
    dhidden, dW_2, db_2 = linear_backward.sympy(G, pre.applyfunc(f), W_2)
    dx, dW_1, db_1 = linear_backward.sympy(_elementwise_backward(dhidden, pre, prime), x, W_1)
    return dx, dW_1, db_1, dW_2, db_2


FFN_INPUTS = (("G", "(T, d)"), ("x", "(T, d)"), ("W_1", "(d, f)"), ("b_1", "(1, f)"),
              ("W_2", "(f, d)"), ("b_2", "(1, d)"))
FFN_SYMBOLS = (G_SYMBOL, Symbol("x", "(T, d_model)", "input rows"),
               Symbol("W_1", "(d_model, d_ff)", "first map"), Symbol("b_1", "(d_ff,)", "bias"),
               Symbol("W_2", "(d_ff, d_model)", "second map"), Symbol("b_2", "(d_model,)", "bias"),
               Symbol("a", "(T, d_ff)", "pre-activations"),
               Symbol(r"\sigma", "()", "the activation, elementwise; σ' its derivative"),
               Symbol("y", "(T, d_model)", "output rows"))
FFN_TOLERANCE = Tolerance(r"\lambda \sqrt{d_{\mathrm{ff}}}\,u", reduction="d_ff")


def _ffn_latex(act: str) -> str:
    return (r"y = \sigma(a) W_2 + b_2,\ a = xW_1 + b_1,\ \sigma = \text{" + act + r"}:\quad "
            r"\frac{\partial L}{\partial a} = (G W_2^\top) \odot \sigma'(a),\ "
            r"\frac{\partial L}{\partial W_2} = \sigma(a)^\top G,\ "
            r"\frac{\partial L}{\partial W_1} = x^\top \frac{\partial L}{\partial a},\ "
            r"\frac{\partial L}{\partial x} = \frac{\partial L}{\partial a} W_1^\top")


@equation(id="ffn_relu_backward", title="Backward of the ReLU feed-forward network",
          group="gradients", latex=_ffn_latex("ReLU"), symbols=FFN_SYMBOLS,
          sources=(Source(BLUEPRINT, "eq 6"),), reference="ffn_relu_backward",
          tolerance=FFN_TOLERANCE, sympy_inputs=FFN_INPUTS,
          notes="Returns (∂x, ∂W_1, ∂b_1, ∂W_2, ∂b_2).")
def ffn_relu_backward(G, x, W_1, b_1, W_2, b_2):
    return _ffn_backward(G, x, W_1, b_1, W_2, "relu")


@equation(id="ffn_gelu_backward", title="Backward of the GELU feed-forward network",
          group="gradients", latex=_ffn_latex("GELU"), symbols=FFN_SYMBOLS,
          sources=(Source(BLUEPRINT, "eq 6"),), reference="ffn_gelu_backward",
          tolerance=FFN_TOLERANCE, sympy_inputs=FFN_INPUTS,
          notes="Returns (∂x, ∂W_1, ∂b_1, ∂W_2, ∂b_2).")
def ffn_gelu_backward(G, x, W_1, b_1, W_2, b_2):
    return _ffn_backward(G, x, W_1, b_1, W_2, "gelu")


@equation(id="ffn_gelu_tanh_backward",
          title="Backward of the tanh-GELU feed-forward network (GPT-2)",
          group="gradients", latex=_ffn_latex(r"GELU\_tanh"), symbols=FFN_SYMBOLS,
          sources=(Source(BLUEPRINT, "eq 6"),), reference="ffn_gelu_tanh_backward",
          tolerance=FFN_TOLERANCE, sympy_inputs=FFN_INPUTS,
          notes="Returns (∂x, ∂W_1, ∂b_1, ∂W_2, ∂b_2).")
def ffn_gelu_tanh_backward(G, x, W_1, b_1, W_2, b_2):
    return _ffn_backward(G, x, W_1, b_1, W_2, "gelu_tanh")


@equation(
    id="ffn_guide_product_backward",
    title="Backward of the Guide's product feed-forward network",
    group="gradients",
    latex=r"y = \sigma(a) \odot \sigma(c),\ a = xW_1 + b_1,\ c = xW_2 + b_2:\quad "
          r"\frac{\partial L}{\partial a} = G \odot \sigma(c) \odot \sigma'(a),\ "
          r"\frac{\partial L}{\partial c} = G \odot \sigma(a) \odot \sigma'(c),\ "
          r"\frac{\partial L}{\partial x} = \frac{\partial L}{\partial a} W_1^\top + "
          r"\frac{\partial L}{\partial c} W_2^\top",
    symbols=(G_SYMBOL, Symbol("x", "(T, d_model)", "input rows"),
             Symbol("W_1", "(d_model, d_model)", "first map (d_ff = d_model)"),
             Symbol("b_1", "(d_model,)", "bias"),
             Symbol("W_2", "(d_model, d_model)", "second map: it also reads x"),
             Symbol("b_2", "(d_model,)", "bias"),
             Symbol("a", "(T, d_model)", "pre-activations of the first map"),
             Symbol("c", "(T, d_model)", "pre-activations of the second map"),
             Symbol(r"\sigma", "()", "ReLU, elementwise; σ' its derivative"),
             Symbol("y", "(T, d_model)", "output rows")),
    sources=(Source(GUIDE, "sec. 4"),),
    reference="ffn_guide_product_backward",
    tolerance=Tolerance(r"\lambda \sqrt{d}\,u", reduction="d"),
    notes="x feeds both maps, so its gradient is the sum of the two. σ = ReLU.",
    sympy_inputs=(("G", "(T, d)"), ("x", "(T, d)"), ("W_1", "(d, d)"), ("b_1", "(1, d)"),
                  ("W_2", "(d, d)"), ("b_2", "(1, d)")),
)
def ffn_guide_product_backward(G, x, W_1, b_1, W_2, b_2):
    relu = ACTIVATIONS["relu"][0]
    a, c = _add_row(x * W_1, b_1), _add_row(x * W_2, b_2)
    da = _elementwise_backward(_hadamard(G, c.applyfunc(relu)), a, _relu_prime)
    dc = _elementwise_backward(_hadamard(G, a.applyfunc(relu)), c, _relu_prime)
    dx_1, dW_1, db_1 = linear_backward.sympy(da, x, W_1)
    dx_2, dW_2, db_2 = linear_backward.sympy(dc, x, W_2)
    return dx_1 + dx_2, dW_1, db_1, dW_2, db_2


# --- residual forms and blocks ----------------------------------------------------------------------


@equation(
    id="residual_backward",
    title="Backward of a residual connection",
    group="gradients",
    latex=r"y = x + f(x):\quad \frac{\partial L}{\partial x} = G + J_f^\top G",
    symbols=(G_SYMBOL, Symbol("x", "(T, d_model)", "input rows"),
             Symbol("f", "(T, d_model) → (T, d_model)", "the branch (attention or FFN)"),
             Symbol("y", "(T, d_model)", "output rows"),
             Symbol(r"J_f^\top G", "(T, d_model)", "the gradient through the branch")),
    sources=(Source(BLUEPRINT, "eq 7"), Source(BLUEPRINT, "eq 8"), Source(NOTES, "residual stream")),
    reference="residual_backward",
    tolerance=Tolerance(r"u", reduction="1"),
    notes="The skip path copies the gradient unchanged: this is why gradients reach early "
          "layers of a deep residual network.",
    sympy_inputs=(("G", "(T, d)"), ("G_branch", "(T, d)")),
)
def residual_backward(G, G_branch):
    return G + G_branch


def _block_ops(config):
    n_heads = config.n_heads
    eps = sp.Rational(config.ln_eps)  # the float64 value, exactly

    def attn(dY, H, p, g):
        dH, g["attn.w_qkv"], db_qkv, g["attn.w_o"], db_o = multi_head_attention_backward.sympy(
            dY, H, p["attn.w_qkv"], p.get("attn.b_qkv"), p["attn.w_o"], p.get("attn.b_o"),
            n_heads=n_heads)
        if "attn.b_qkv" in p:
            g["attn.b_qkv"], g["attn.b_o"] = db_qkv, db_o
        return dH

    def ffn(dY, H, p, g):
        entry = FFN_BACKWARD[config.ffn]
        dH, g["ffn.w_1"], db_1, g["ffn.w_2"], db_2 = entry.sympy(
            dY, H, p["ffn.w_1"], p.get("ffn.b_1"), p["ffn.w_2"], p.get("ffn.b_2"))
        if "ffn.b_1" in p:
            g["ffn.b_1"], g["ffn.b_2"] = db_1, db_2
        return dH

    def ln(dY, H, p, which, g):
        dH, g[f"{which}.weight"], g[f"{which}.bias"] = layer_norm_backward.sympy(
            dY, H, p[f"{which}.weight"], eps=eps)
        return dH

    return attn, ffn, ln


def _forward_ops(config):
    """The block's forward pieces: the forward entries' own sympy forms, needed to
    recompute each branch's input."""
    from gptspec.spec.attention import multi_head_attention
    from gptspec.spec.block import FFN, layer_norm

    def attn(H, p):
        return multi_head_attention.sympy(H, p["attn.w_qkv"], p.get("attn.b_qkv"), p["attn.w_o"],
                                          p.get("attn.b_o"), config.n_heads)

    def ffn(H, p):
        return FFN[config.ffn].sympy(H, p["ffn.w_1"], p.get("ffn.b_1"), p["ffn.w_2"],
                                     p.get("ffn.b_2"))

    def ln(H, p, which):
        return layer_norm.sympy(H, p[f"{which}.weight"], p[f"{which}.bias"],
                                sp.Rational(config.ln_eps))

    return attn, ffn, ln


BLOCK_SYMBOLS = (G_SYMBOL, Symbol("H", "(T, d_model)", "block input"),
                 Symbol("H_{\\text{out}}", "(T, d_model)", "block output"),
                 Symbol("p", "parameters", "the block's parameters, named as in the schema"),
                 Symbol("J", "(T d_model, T d_model)", "the Jacobian of the piece named in its "
                        "subscript, at the forward pass's values"))
# Every block backward also returns the parameters' gradients.
PARAMETER_GRADIENTS = (r",\quad \text{and } \frac{\partial L}{\partial p} \text{ for every "
                       r"parameter } p \text{ of the block}")


@equation(
    id="block_pre_ln_backward",
    title="Backward of a pre-LN block (GPT-2/3)",
    group="gradients",
    latex=r"H' = H + \text{MHA}(\text{LN}_1(H)),\ H_{\text{out}} = H' + \text{FFN}(\text{LN}_2(H')):\quad "
          r"\frac{\partial L}{\partial H'} = G + J_{\text{LN}_2}^\top J_{\text{FFN}}^\top G,\ "
          r"\frac{\partial L}{\partial H} = \frac{\partial L}{\partial H'} + "
          r"J_{\text{LN}_1}^\top J_{\text{MHA}}^\top \frac{\partial L}{\partial H'}"
          + PARAMETER_GRADIENTS,
    symbols=BLOCK_SYMBOLS + (Symbol("H'", "(T, d_model)", "the stream after attention"),),
    sources=(Source(NOTES, "residual blocks"),),
    reference="block_pre_ln_backward",
    tolerance=Tolerance(r"\lambda \sqrt{T d}\,u", reduction="T * d"),
    notes="Returns (∂H, the block's parameter gradients by schema name without the "
          "blocks.{l}. prefix).",
)
def block_pre_ln_backward(G, H, p, config):
    attn_b, ffn_b, ln_b = _block_ops(config)
    attn_f, _, ln_f = _forward_ops(config)
    g: dict = {}
    H1 = H + attn_f(ln_f(H, p, "ln_1"), p)
    dH1 = residual_backward.sympy(G, ln_b(ffn_b(G, ln_f(H1, p, "ln_2"), p, g), H1, p, "ln_2", g))
    dH = residual_backward.sympy(dH1, ln_b(attn_b(dH1, ln_f(H, p, "ln_1"), p, g), H, p, "ln_1", g))
    return dH, g


@equation(
    id="block_post_ln_backward",
    title="Backward of a post-LN block (Blueprint eqs 7-8)",
    group="gradients",
    latex=r"H' = \text{LN}_1(H + \text{MHA}(H)),\ H_{\text{out}} = \text{LN}_2(S_2),\ "
          r"S_2 = H' + \text{FFN}(H'):\quad "
          r"\frac{\partial L}{\partial S_2} = J_{\text{LN}_2}^\top G,\ "
          r"\frac{\partial L}{\partial H'} = \frac{\partial L}{\partial S_2} + "
          r"J_{\text{FFN}}^\top \frac{\partial L}{\partial S_2},\ \dots" + PARAMETER_GRADIENTS,
    symbols=BLOCK_SYMBOLS + (Symbol("H'", "(T, d_model)", "the stream after the first sublayer"),
                             Symbol("S_2", "(T, d_model)", "the second LayerNorm's input")),
    sources=(Source(BLUEPRINT, "eq 7"), Source(BLUEPRINT, "eq 8")),
    reference="block_post_ln_backward",
    tolerance=Tolerance(r"\lambda \sqrt{T d}\,u", reduction="T * d"),
    notes="Every gradient passes through a LayerNorm before it reaches a residual sum.",
)
def block_post_ln_backward(G, H, p, config):
    attn_b, ffn_b, ln_b = _block_ops(config)
    attn_f, ffn_f, ln_f = _forward_ops(config)
    g: dict = {}
    S1 = H + attn_f(H, p)
    H1 = ln_f(S1, p, "ln_1")
    S2 = H1 + ffn_f(H1, p)
    dS2 = ln_b(G, S2, p, "ln_2", g)
    dH1 = residual_backward.sympy(dS2, ffn_b(dS2, H1, p, g))
    dS1 = ln_b(dH1, S1, p, "ln_1", g)
    return residual_backward.sympy(dS1, attn_b(dS1, H, p, g)), g


@equation(
    id="block_guide_backward",
    title="Backward of the Guide's block",
    group="gradients",
    latex=r"H_{\text{out}} = \text{LN}(S),\ S = \text{FFNN}(\text{Attn}(H)) + H:\quad "
          r"\frac{\partial L}{\partial S} = J_{\text{LN}}^\top G,\ "
          r"\frac{\partial L}{\partial H} = \frac{\partial L}{\partial S} + "
          r"J_{\text{Attn}}^\top J_{\text{FFNN}}^\top \frac{\partial L}{\partial S}"
          + PARAMETER_GRADIENTS,
    symbols=BLOCK_SYMBOLS + (Symbol("S", "(T, d_model)", "the LayerNorm's input"),),
    sources=(Source(GUIDE, "sec. 5"),),
    reference="block_guide_backward",
    tolerance=Tolerance(r"\lambda \sqrt{T d}\,u", reduction="T * d"),
)
def block_guide_backward(G, H, p, config):
    attn_b, ffn_b, ln_b = _block_ops(config)
    attn_f, ffn_f, _ = _forward_ops(config)
    g: dict = {}
    A = attn_f(H, p)
    dS = ln_b(G, ffn_f(A, p) + H, p, "ln_1", g)
    return residual_backward.sympy(dS, attn_b(ffn_b(dS, A, p, g), H, p, g)), g


FFN_BACKWARD = {"relu": ffn_relu_backward, "gelu": ffn_gelu_backward,
                "gelu_tanh": ffn_gelu_tanh_backward, "guide_product": ffn_guide_product_backward}


@equation(
    id="gpt_backward",
    title="Backpropagation through the whole model",
    group="gradients",
    latex=r"\frac{\partial \bar{\mathcal{L}}}{\partial Z} = \frac{1}{N}\left("
          r"\operatorname{softmax}(Z) - Y\right) \;\longrightarrow\; "
          r"\frac{\partial \bar{\mathcal{L}}}{\partial \theta} \text{ for every parameter } "
          r"\theta",
    symbols=(Symbol("Z", "(T, V)", "the logits of gpt_forward on the input tokens x"),
             Symbol("Y", "(T, V)", "the one-hot target tokens y"),
             Symbol("N", "()", "the number of predicted positions"),
             Symbol(r"\bar{\mathcal{L}}", "()", "the mean cross-entropy"),
             Symbol(r"\theta", "parameters", "every parameter of the schema; the backward "
                    "entries above carry the gradient from Z to each, in reverse order of "
                    "the forward pass")),
    sources=(Source(BLUEPRINT, "eq 10"), Source(BLUEPRINT, "sec. 3.2")),
    reference="gpt_backward",
    tolerance=Tolerance(r"\lambda\,\varepsilon_{g},\quad \varepsilon_{g_s} = "
                        r"\varepsilon_{g_{s+1}}\text{ and the activations' errors carried "
                        r"through stage } s \oplus "
                        r"\sqrt{n_s}\,u_{\mathrm{acc}}\textstyle\sum|\text{terms}_s| \oplus "
                        r"u\,|g_s|",
                        reduction="T * V",
                        note="the backward pass's D stages in sequence: at each, the upstream gradient's "
                             "error and the forward activations' errors are carried through the equation "
                             "to first order, each reduction of length n adds √n·u_acc·Σ|terms| and each "
                             "stored result u|g|; LayerNorm's backward amplifies what reaches it by "
                             "|γ|/√(σ² + ε), compounding through the layers "
                             "(gradient_budgets.gpt_backward_bound); its check: λ × the error scale "
                             "propagated through the reference's backward pass stage by stage "
                             "(gradient_budgets.gpt_backward_bound)"),
    notes="The meaning is the derivative itself: with symbolic parameters, sympy "
          "differentiates the mean cross-entropy of gpt_forward. The reference computes the "
          "same numbers by hand, entry by entry, and returns (loss, gradients by name).",
)
def gpt_backward(x, y, params, config):
    from gptspec.spec.loss import cross_entropy_mean
    from gptspec.spec.output import gpt_forward

    Z = gpt_forward.sympy(x, params, config)
    Y = sp.Matrix(len(y), Z.cols, lambda t, v: 1 if y[t] == v else 0)
    L = cross_entropy_mean.sympy(Z, Y)
    return L, {name: P.applyfunc(lambda s: sp.diff(L, s)) for name, P in params.items()}
