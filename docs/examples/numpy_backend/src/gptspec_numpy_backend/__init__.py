"""An example third-party backend for gptspec: the decoder-only GPT in NumPy float32.

Written independently of ``gptspec.reference``: every contraction is an ``einsum`` over
named axes (b batch, t/s positions, h heads, k head features, d model features, f FFN
features, v vocabulary), activations are computed in float32, and the only thing taken
from gptspec is what the protocol hands over (a ``GPTConfig`` and parameter names).

Protocol 2 (see ``gptspec.conformance.protocol``): ``protocol_version = 2``, ``name``,
``version``, ``device``, ``dtype``, ``forward(tokens, params, config)``, and optional
operations under the reference functions' names, each taking float64 NumPy and returning float32 NumPy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__version__ = "0.1.0"

F32 = np.float32
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _f32(x: Any) -> np.ndarray:
    """The backend's one rounding of an input (exact for inputs already in float32)."""
    return np.asarray(x, dtype=F32)


class NumpyBackend:
    """The forward pass in float32 NumPy. ``device`` is always the CPU."""

    protocol_version = 2  # gptspec.conformance.protocol: forward(tokens, params, config)
    name = "numpy-f32"
    version = f"{__version__} (numpy {np.__version__})"
    device = "cpu"
    dtype = "float32"

    def __init__(self, device: str = "cpu", dtype: str = "float32") -> None:
        if device != "cpu" or dtype != "float32":
            raise ValueError("the NumPy backend computes on the CPU in float32 only")

    # --- embedding ---------------------------------------------------------------------

    def one_hot(self, tokens, vocab_size):
        # compare with 0..V-1 rather than index np.eye(V): the identity is V² numbers
        # (10 GB at GPT-2's vocabulary), the result only T·V
        tokens = np.asarray(tokens)
        return (tokens[..., None] == np.arange(int(vocab_size))).astype(F32)

    def token_embedding(self, tokens, W_E):
        return np.take(_f32(W_E), np.asarray(tokens), axis=0)

    def token_embedding_one_hot(self, X, W_E):
        return np.einsum("...tv,vd->...td", _f32(X), _f32(W_E))

    def positional_embedding(self, T, W_P):
        return _f32(W_P)[: int(T)]

    def input_representation(self, E, P):
        return _f32(E) + _f32(P)

    # --- attention -----------------------------------------------------------------------

    def linear(self, x, W, b=None):
        y = np.einsum("...i,io->...o", _f32(x), _f32(W))
        return y if b is None else y + _f32(b)

    def qkv_projection(self, H, W_qkv, b_qkv=None):
        return tuple(np.split(self.linear(H, W_qkv, b_qkv), 3, axis=-1))

    def split_heads(self, X, n_heads):
        X = _f32(X)
        *lead, T, d = X.shape
        return np.swapaxes(X.reshape(*lead, T, n_heads, d // n_heads), -3, -2)

    def merge_heads(self, X):
        X = _f32(X)
        *lead, h, T, k = X.shape
        return np.swapaxes(X, -3, -2).reshape(*lead, T, h * k)

    def causal_mask(self, T):
        future = np.arange(T)[None, :] > np.arange(T)[:, None]
        return np.where(future, F32(-np.inf), F32(0.0))

    def softmax(self, z, axis=-1):
        z = _f32(z)
        e = np.exp(z - z.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True, dtype=F32)

    def softmax_shifted(self, z, c, axis=-1):
        e = np.exp(_f32(z) - _f32(c))
        return e / e.sum(axis=axis, keepdims=True, dtype=F32)

    def attention_scores(self, Q, K, M):
        Q, K = _f32(Q), _f32(K)
        S = np.einsum("...tk,...sk->...ts", Q, K) / F32(math.sqrt(Q.shape[-1]))
        return S + _f32(M)

    def attention_weights(self, Q, K, M):
        return self.softmax(self.attention_scores(Q, K, M))

    def scaled_dot_product_attention(self, Q, K, V, M):
        return np.einsum("...ts,...sk->...tk", self.attention_weights(Q, K, M), _f32(V))

    def _heads(self, H, W_qkv, b_qkv, n_heads):
        Q, K, V = (self.split_heads(X, n_heads) for X in self.qkv_projection(H, W_qkv, b_qkv))
        return self.scaled_dot_product_attention(Q, K, V, self.causal_mask(Q.shape[-2]))

    def multi_head_attention(self, H, W_qkv, b_qkv, W_O, b_O, n_heads):
        return self.linear(self.merge_heads(self._heads(H, W_qkv, b_qkv, n_heads)), W_O, b_O)

    def multi_head_attention_head_sum(self, H, W_qkv, b_qkv, W_O, b_O, n_heads):
        heads = self._heads(H, W_qkv, b_qkv, n_heads)
        W = _f32(W_O).reshape(n_heads, -1, np.shape(W_O)[-1])  # row block i is W_O⁽ⁱ⁾
        out = np.einsum("...htk,hkd->...td", heads, W)
        return out if b_O is None else out + _f32(b_O)

    # --- normalisation and feed-forward --------------------------------------------------

    def layer_norm(self, x, gamma, beta, eps):
        x = _f32(x)
        centred = x - x.mean(axis=-1, keepdims=True, dtype=F32)
        var = np.einsum("...d,...d->...", centred, centred)[..., None] / F32(x.shape[-1])
        return _f32(gamma) * (centred / np.sqrt(var + F32(eps))) + _f32(beta)

    def final_layer_norm(self, H, gamma, beta, eps):
        return self.layer_norm(H, gamma, beta, eps)

    def relu(self, x):
        return np.maximum(_f32(x), F32(0.0))

    def gelu(self, x):
        x = _f32(x)
        return x * ((1.0 + _erf(x / math.sqrt(2.0))) / 2.0).astype(F32)

    def gelu_tanh(self, x):
        x = _f32(x)
        inner = F32(math.sqrt(2.0 / math.pi)) * (x + F32(0.044715) * x * x * x)
        return F32(0.5) * x * (F32(1.0) + np.tanh(inner))

    def _ffn(self, act, x, W_1, b_1, W_2, b_2):
        return self.linear(act(self.linear(x, W_1, b_1)), W_2, b_2)

    def ffn_relu(self, x, W_1, b_1, W_2, b_2):
        return self._ffn(self.relu, x, W_1, b_1, W_2, b_2)

    def ffn_gelu(self, x, W_1, b_1, W_2, b_2):
        return self._ffn(self.gelu, x, W_1, b_1, W_2, b_2)

    def ffn_gelu_tanh(self, x, W_1, b_1, W_2, b_2):
        return self._ffn(self.gelu_tanh, x, W_1, b_1, W_2, b_2)

    def ffn_guide_product(self, x, W_1, b_1, W_2, b_2):
        return self.relu(self.linear(x, W_1, b_1)) * self.relu(self.linear(x, W_2, b_2))

    # --- blocks and the model ----------------------------------------------------------------

    def _sublayers(self, p, config):
        def ln(which):
            return lambda X: self.layer_norm(X, p[f"{which}.weight"], p[f"{which}.bias"],
                                             config.ln_eps)

        def attn(X):
            return self.multi_head_attention(X, p["attn.w_qkv"], p.get("attn.b_qkv"),
                                             p["attn.w_o"], p.get("attn.b_o"), config.n_heads)

        ffn_op = getattr(self, f"ffn_{config.ffn}")

        def ffn(X):
            return ffn_op(X, p["ffn.w_1"], p.get("ffn.b_1"), p["ffn.w_2"], p.get("ffn.b_2"))

        return ln, attn, ffn

    def block_pre_ln(self, H, p, config):
        ln, attn, ffn = self._sublayers(p, config)
        H = _f32(H) + attn(ln("ln_1")(_f32(H)))
        return H + ffn(ln("ln_2")(H))

    def block_post_ln(self, H, p, config):
        ln, attn, ffn = self._sublayers(p, config)
        H = ln("ln_1")(_f32(H) + attn(_f32(H)))
        return ln("ln_2")(H + ffn(H))

    def block_guide(self, H, p, config):
        ln, attn, ffn = self._sublayers(p, config)
        return ln("ln_1")(ffn(attn(_f32(H))) + _f32(H))

    def unembed_tied(self, H, W_E):
        return np.einsum("...d,vd->...v", _f32(H), _f32(W_E))

    def unembed_untied(self, H, W_U, b_U=None):
        return self.linear(H, W_U, b_U)

    def next_token_distribution(self, logits):
        return self.softmax(logits)

    def sequence_log_probability(self, tokens, logits):
        z = _f32(logits)[..., :-1, :]
        shifted = z - z.max(axis=-1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True, dtype=F32))
        nxt = np.asarray(tokens)[..., 1:, None]
        return np.take_along_axis(log_p, nxt, axis=-1)[..., 0].sum(axis=-1, dtype=F32)

    def forward(self, tokens, params, config):
        tokens = np.asarray(tokens)
        block = getattr(self, {"pre": "block_pre_ln", "post": "block_post_ln",
                               "guide": "block_guide"}[config.norm])
        x = self.token_embedding(tokens, params["wte"])
        if config.positional_embedding:  # the Guide as written has none
            x = self.input_representation(x, self.positional_embedding(tokens.shape[-1],
                                                                       params["wpe"]))
        for layer in range(config.n_layers):
            prefix = f"blocks.{layer}."
            p = {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}
            x = block(x, p, config)
        if config.final_norm:
            x = self.final_layer_norm(x, params["ln_f.weight"], params["ln_f.bias"],
                                      config.ln_eps)
        if config.tied_embeddings:
            return self.unembed_tied(x, params["wte"])
        return self.unembed_untied(x, params["w_u"], params.get("b_u"))
