"""A correct NumPy backend that emulates a dtype, for the soundness gate.

Every sum runs in float32 as one sequential loop in reverse order (the last term first),
which no BLAS does; every stored result is rounded to the dtype (float32, or float16 /
bfloat16 by round to nearest even, then held in float32, which represents them exactly);
the insides of LayerNorm, softmax and the activations run in float32 as 16-bit kernels
do. It implements ``forward`` and the operations the model is built from.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gptspec.conformance.budgets import round_to
from gptspec.conformance.protocol import NotApplicable
from gptspec.spec.config import GPTConfig

F32 = np.float32
_erf = np.vectorize(math.erf, otypes=[np.float64])


class EmulatedNumpy:
    """float32 arithmetic, reversed sequential sums, results rounded to ``dtype``."""

    protocol_version = 2  # gptspec.conformance.protocol: forward(tokens, params, config)
    name = "numpy-emulated"
    version = f"soundness gate, numpy {np.__version__}"
    device = "cpu"

    def __init__(self, device: str = "cpu", dtype: str = "float32") -> None:
        if device != "cpu" or dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError("the emulating backend runs on the CPU in float32, float16 or "
                             "bfloat16")
        self.dtype = dtype

    def _store(self, x: Any) -> np.ndarray:
        """A stored result: rounded to the dtype, held in float32."""
        x = np.asarray(x, dtype=F32)
        return x if self.dtype == "float32" else round_to(x, self.dtype).astype(F32)

    def _in(self, x: Any) -> np.ndarray:
        return self._store(np.asarray(x, dtype=np.float64))

    @staticmethod
    def _sum(terms: np.ndarray, axis: int) -> np.ndarray:
        """Σ along ``axis`` in float32, one term at a time, the last first."""
        terms = np.moveaxis(np.asarray(terms, dtype=F32), axis, 0)
        acc = np.zeros(terms.shape[1:], dtype=F32)
        for term in terms[::-1]:
            acc = acc + term
        return acc

    @staticmethod
    def _matmul(A: np.ndarray, B: np.ndarray) -> np.ndarray:
        """A B with the inner sum reversed (float32 accumulation), not rounded: the same
        sums as ``_sum`` over the products, one inner index at a time, so no array of all
        the products is ever held (at V = 50257, T = 1024 that would be 147 GiB)."""
        A, B = np.asarray(A, dtype=F32), np.asarray(B, dtype=F32)
        acc = np.zeros(np.broadcast_shapes(A.shape[:-1] + (1,), B.shape[:-2] + (1, B.shape[-1])),
                       dtype=F32)
        for k in range(A.shape[-1] - 1, -1, -1):
            acc = acc + A[..., :, k, None] * B[..., k, None, :]
        return acc

    # --- the operations ----------------------------------------------------------------

    def linear(self, x, W, b=None):
        x, W = self._in(x), self._in(W)
        y = self._matmul(x, W)
        return self._store(y if b is None else y + self._in(b))

    def softmax(self, z, axis=-1):
        z = self._in(z)
        e = np.exp(z - z.max(axis=axis, keepdims=True))
        return self._store(e / np.expand_dims(self._sum(e, axis), axis))

    def layer_norm(self, x, gamma, beta, eps):
        x = self._in(x)
        n = F32(x.shape[-1])
        centred = x - (self._sum(x, -1) / n)[..., None]
        var = self._sum(centred * centred, -1) / n
        xhat = centred / np.sqrt(var + F32(eps))[..., None]
        return self._store(xhat * self._in(gamma) + self._in(beta))

    def final_layer_norm(self, H, gamma, beta, eps):
        return self.layer_norm(H, gamma, beta, eps)

    def relu(self, x):
        x = self._in(x)
        return np.where(x > 0, x, F32(0))

    def gelu(self, x):
        x = self._in(x)
        return self._store(x * (0.5 * (1 + _erf(x / math.sqrt(2)))).astype(F32))

    def gelu_tanh(self, x):
        x = self._in(x)
        inner = F32(math.sqrt(2 / math.pi)) * (x + F32(0.044715) * x * x * x)
        return self._store(F32(0.5) * x * (1 + np.tanh(inner)))

    def attention_weights(self, Q, K, M):
        Q, K = self._in(Q), self._in(K)
        S = self._store(self._matmul(Q, np.swapaxes(K, -1, -2)) / F32(math.sqrt(Q.shape[-1])))
        return self.softmax(S + np.asarray(M, dtype=F32))

    def scaled_dot_product_attention(self, Q, K, V, M):
        return self._store(self._matmul(self.attention_weights(Q, K, M), self._in(V)))

    def multi_head_attention(self, H, W_qkv, b_qkv, W_O, b_O, n_heads):
        QKV = self.linear(H, W_qkv, b_qkv)
        d = QKV.shape[-1] // 3
        *lead, T, _ = QKV.shape

        def heads(X):
            return np.swapaxes(X.reshape(*lead, T, n_heads, d // n_heads), -3, -2)

        Q, K, V = (heads(QKV[..., i * d:(i + 1) * d]) for i in range(3))
        M = np.triu(np.full((T, T), -np.inf, dtype=F32), k=1)
        O = self.scaled_dot_product_attention(Q, K, V, M)
        return self.linear(np.swapaxes(O, -3, -2).reshape(*lead, T, d), W_O, b_O)

    def _ffn(self, variant, x, W_1, b_1, W_2, b_2):
        if variant == "guide_product":
            return self._store(self.relu(self.linear(x, W_1, b_1)) *
                               self.relu(self.linear(x, W_2, b_2)))
        act = {"relu": self.relu, "gelu": self.gelu, "gelu_tanh": self.gelu_tanh}[variant]
        return self.linear(act(self.linear(x, W_1, b_1)), W_2, b_2)

    def ffn_relu(self, x, W_1, b_1, W_2, b_2=None):
        return self._ffn("relu", x, W_1, b_1, W_2, b_2)

    def ffn_gelu(self, x, W_1, b_1, W_2, b_2=None):
        return self._ffn("gelu", x, W_1, b_1, W_2, b_2)

    def ffn_gelu_tanh(self, x, W_1, b_1, W_2, b_2=None):
        return self._ffn("gelu_tanh", x, W_1, b_1, W_2, b_2)

    def ffn_guide_product(self, x, W_1, b_1, W_2, b_2):
        return self._ffn("guide_product", x, W_1, b_1, W_2, b_2)

    # --- the model ---------------------------------------------------------------------

    # Products of the unembedding beyond which explicit float32 loops take minutes per
    # forward (GPT-2 small at T = 1024: 4·10¹⁰); the backend declares them not applicable.
    MAX_UNEMBEDDING_PRODUCTS = 2**32

    def forward(self, tokens, params: dict, config: GPTConfig) -> np.ndarray:
        tokens = np.asarray(tokens)
        products = tokens.size * config.d_model * config.vocab_size
        if products > self.MAX_UNEMBEDDING_PRODUCTS:
            raise NotApplicable(f"{products:.1e} multiply-adds in the unembedding: too slow "
                                "for explicit float32 loops")
        p = {k: self._in(v) for k, v in params.items()}
        H = p["wte"][tokens]
        if config.positional_embedding:
            H = self._store(H + p["wpe"][: tokens.shape[-1]])
        for layer in range(config.n_layers):
            q = {k.removeprefix(f"blocks.{layer}."): v for k, v in p.items()
                 if k.startswith(f"blocks.{layer}.")}

            def ln(X, which, q=q):
                return self.layer_norm(X, q[f"{which}.weight"], q[f"{which}.bias"],
                                       config.ln_eps)

            def attn(X, q=q):
                return self.multi_head_attention(X, q["attn.w_qkv"], q.get("attn.b_qkv"),
                                                 q["attn.w_o"], q.get("attn.b_o"),
                                                 config.n_heads)

            def mlp(X, q=q):
                return self._ffn(config.ffn, X, q["ffn.w_1"], q.get("ffn.b_1"), q["ffn.w_2"],
                                 q.get("ffn.b_2"))

            if config.norm == "pre":
                H = self._store(H + attn(ln(H, "ln_1")))
                H = self._store(H + mlp(ln(H, "ln_2")))
            elif config.norm == "post":
                H = ln(self._store(H + attn(H)), "ln_1")
                H = ln(self._store(H + mlp(H)), "ln_2")
            else:
                H = ln(self._store(mlp(attn(H)) + H), "ln_1")
        if config.final_norm:
            H = self.layer_norm(H, p["ln_f.weight"], p["ln_f.bias"], config.ln_eps)
        if config.tied_embeddings:
            return self.linear(H, p["wte"].T)
        return self.linear(H, p["w_u"], p.get("b_u"))
