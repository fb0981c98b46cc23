"""The forward pass as functional PyTorch operations, one per reference function.

Each has the name and argument order of its float64 reference in ``gptspec.reference``,
but takes torch tensors of any float dtype on any device; ``gptspec.fast.model`` is built
from them, so checking an operation checks the model's own code. The compute dtype is the
tensors'. Where a 16-bit dtype would lose accuracy in a reduction, it runs in float32 and
rounds back: LayerNorm's mean and variance, softmax's sum, the log-softmax of
``sequence_log_probability``. PyTorch's SDPA kernels and matrix products accumulate in
float32 for 16-bit inputs on CPU and CUDA.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeAlias

import torch
import torch.nn.functional as F

from gptspec.fast import cpu_gelu
from gptspec.fast.prepacked import PackedMatrix
from gptspec.spec.config import GPTConfig

Tensor = torch.Tensor
Matrix: TypeAlias = torch.Tensor | PackedMatrix  # a weight, or the caller's prepacked form

__all__ = [
    "one_hot",
    "token_embedding_one_hot",
    "token_embedding",
    "positional_embedding",
    "input_representation",
    "linear",
    "qkv_projection",
    "split_heads",
    "merge_heads",
    "causal_mask",
    "softmax_shifted",
    "softmax",
    "attention_scores",
    "attention_weights",
    "scaled_dot_product_attention",
    "multi_head_attention",
    "multi_head_attention_head_sum",
    "layer_norm",
    "relu",
    "gelu",
    "gelu_tanh",
    "ffn_relu",
    "ffn_gelu",
    "ffn_gelu_tanh",
    "ffn_guide_product",
    "block_pre_ln",
    "block_post_ln",
    "block_guide",
    "final_layer_norm",
    "unembed_tied",
    "unembed_untied",
    "next_token_distribution",
    "sequence_log_probability",
]

HALF_DTYPES = (torch.float16, torch.bfloat16)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype reductions run in: float32 for 16-bit inputs, else the dtype itself."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


# --- embedding -------------------------------------------------------------------------


def one_hot(tokens: Tensor, vocab_size: int, *, dtype: torch.dtype = torch.float32) -> Tensor:
    """X[t, v] = 1 if x_t = v else 0."""
    return F.one_hot(tokens.long(), vocab_size).to(dtype)


def token_embedding_one_hot(X: Tensor, W_E: Tensor) -> Tensor:
    """E = X W_E: the one-hot rows select rows of W_E by a matrix product."""
    return X @ W_E


def token_embedding(tokens: Tensor, W_E: Tensor) -> Tensor:
    """e_t = W_E[x_t]: the same map as row selection.

    A 16-bit W_E whose gradient will be taken goes through _RowSelection: PyTorch 2.13's
    CPU backward of F.embedding adds the rows of ∂E into ∂W_E one at a time in the 16-bit
    dtype, so a token seen a thousand times gets a gradient hundreds of roundings off
    (about 190·u·|∂W_E| in bfloat16 at 2048 repeats), where the spec sums in float32."""
    if (W_E.dtype in HALF_DTYPES and torch.is_grad_enabled()
            and W_E.requires_grad):
        return _RowSelection.apply(tokens, W_E)
    return F.embedding(tokens, W_E)


class _RowSelection(torch.autograd.Function):
    """W[tokens], whose backward sums the rows of each token in float32 and rounds once."""

    @staticmethod
    def forward(ctx: Any, tokens: Tensor, W: Tensor) -> Tensor:
        ctx.save_for_backward(tokens)
        ctx.table_shape = W.shape
        return F.embedding(tokens, W)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor]:
        (tokens,) = ctx.saved_tensors
        total = torch.zeros(ctx.table_shape, dtype=torch.float32, device=grad.device)
        total.index_add_(0, tokens.reshape(-1), grad.reshape(-1, grad.shape[-1]).float())
        return None, total.to(grad.dtype)


def positional_embedding(T: int, W_P: Tensor) -> Tensor:
    """P = rows 0 … T−1 of W_P."""
    return W_P[:T]


def positional_embedding_at(positions: Tensor, W_P: Tensor) -> Tensor:
    """Rows ``positions`` of W_P: ``positional_embedding`` when each sequence starts at its
    own offset (the KV-cache path). With positions 0 … T−1 it equals positional_embedding."""
    return F.embedding(positions, W_P)


def input_representation(E: Tensor, P: Tensor) -> Tensor:
    """h_t⁽⁰⁾ = e_t + p_t (Blueprint sec. 2.1)."""
    return E + P


# --- linear maps and attention -----------------------------------------------------------


def linear(x: Tensor, W: Matrix, b: Tensor | None = None) -> Tensor:
    """y = x W + b, with W of shape (in, out).

    F.linear takes the (out, in) matrix; passing the transposed view lets BLAS read W in
    its stored layout and fuses the bias into the product. W may also be the caller's
    prepacked form of the weight (``gptspec.fast.prepacked``, which generation passes for
    16-bit CPU weights): the same product, faster."""
    if isinstance(W, PackedMatrix):
        return W.product(x, b)
    return F.linear(x, W.t(), b)


def qkv_projection(
    H: Tensor, W_qkv: Matrix, b_qkv: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Q = H W_Q + b_Q, K = H W_K + b_K, V = H W_V + b_V (Blueprint eq 2): one fused product
    for all heads, then three views of its columns."""
    QKV = linear(H, W_qkv, b_qkv)
    d = QKV.shape[-1] // 3
    Q, K, V = QKV.split(d, dim=-1)
    return Q, K, V


def split_heads(X: Tensor, n_heads: int) -> Tensor:
    """(…, T, d) → (…, h, T, d_k): head i takes columns i·d_k … (i+1)·d_k − 1 (a view)."""
    *lead, T, d = X.shape
    return X.reshape(*lead, T, n_heads, d // n_heads).transpose(-3, -2)


def merge_heads(X: Tensor) -> Tensor:
    """Concat(head_1, …, head_h): (…, h, T, d_k) → (…, T, h·d_k)."""
    *lead, h, T, dk = X.shape
    return X.transpose(-3, -2).reshape(*lead, T, h * dk)


def causal_mask(
    T: int, *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> Tensor:
    """M[i, j] = 0 if j ≤ i else −∞."""
    return torch.full((T, T), -math.inf, dtype=dtype, device=device).triu(1)


def softmax_shifted(z: Tensor, c: Tensor | float, axis: int = -1) -> Tensor:
    """exp(z − c) / Σ exp(z − c): equal to softmax(z) for every finite c.

    16-bit inputs: computed in float32, rounded back once at the end."""
    acc = accumulation_dtype(z.dtype)
    c = c.to(acc) if isinstance(c, Tensor) else c
    e = torch.exp(z.to(acc) - c)
    return (e / e.sum(dim=axis, keepdim=True)).to(z.dtype)


def softmax(z: Tensor, axis: int = -1) -> Tensor:
    """softmax(z)_i = exp(z_i) / Σ_j exp(z_j), through the shift identity with c = max z
    (torch.softmax subtracts the maximum). 16-bit inputs: computed in float32."""
    return torch.softmax(z, dim=axis, dtype=accumulation_dtype(z.dtype)).to(z.dtype)


def attention_scores(Q: Tensor, K: Tensor, M: Tensor) -> Tensor:
    """S = Q Kᵀ / √d_k + M, in the accumulation dtype with 1/√d_k split over both factors
    (as fused kernels do): near the dtype's largest value Q Kᵀ overflows where S does not."""
    acc = accumulation_dtype(Q.dtype)
    quarter = Q.shape[-1] ** -0.25
    S = (Q.to(acc) * quarter) @ (K.to(acc) * quarter).transpose(-1, -2)
    return (S + M.to(acc)).to(Q.dtype)


def attention_weights(Q: Tensor, K: Tensor, M: Tensor) -> Tensor:
    """A = softmax(S), row by row."""
    return softmax(attention_scores(Q, K, M), axis=-1)


def scaled_dot_product_attention(
    Q: Tensor, K: Tensor, V: Tensor, M: Tensor | None = None, *, is_causal: bool = False
) -> Tensor:
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V (Blueprint eq 3), by PyTorch's fused
    kernel. M is an additive float mask (0 / −∞) or a boolean one (True: may attend); with
    ``is_causal=True`` and no M the kernel applies the causal mask itself."""
    return F.scaled_dot_product_attention(Q, K, V, attn_mask=M, is_causal=is_causal)


def multi_head_attention(
    H: Tensor,
    W_qkv: Matrix,
    b_qkv: Tensor | None,
    W_O: Matrix,
    b_O: Tensor | None,
    n_heads: int,
) -> Tensor:
    """MultiHead(H) = Concat(head_1, …, head_h) W_O + b_O (Blueprint eqs 4–5), causal;
    all heads in one batched kernel call."""
    Q, K, V = (split_heads(X, n_heads) for X in qkv_projection(H, W_qkv, b_qkv))
    heads = scaled_dot_product_attention(Q, K, V, is_causal=True)
    return linear(merge_heads(heads), W_O, b_O)


def multi_head_attention_head_sum(
    H: Tensor,
    W_qkv: Tensor,
    b_qkv: Tensor | None,
    W_O: Tensor,
    b_O: Tensor | None,
    n_heads: int,
) -> Tensor:
    """Σ_i head_i W_O⁽ⁱ⁾ + b_O, with W_O⁽ⁱ⁾ the rows i·d_k … (i+1)·d_k − 1 of W_O (the
    Notes' residual-stream view): one contraction over heads, no loop."""
    Q, K, V = (split_heads(X, n_heads) for X in qkv_projection(H, W_qkv, b_qkv))
    heads = scaled_dot_product_attention(Q, K, V, is_causal=True)  # (…, h, T, d_k)
    W_O_heads = W_O.view(n_heads, W_O.shape[0] // n_heads, W_O.shape[1])  # (h, d_k, d)
    out = torch.einsum("...htk,hkd->...td", heads, W_O_heads)
    return out if b_O is None else out + b_O


# --- normalisation and feed-forward ------------------------------------------------------

# devices whose layer_norm kernel computes 16-bit inputs in float32 and rounds once
_WIDENING_LAYER_NORM = ("cpu", "cuda")


def layer_norm(x: Tensor, gamma: Tensor, beta: Tensor, eps: float) -> Tensor:
    """LN(x) = γ ⊙ (x − μ) / √(σ² + ε) + β over the last axis, σ² the biased variance.

    16-bit inputs: mean, variance and the affine map run in float32, rounded back once.
    PyTorch's CPU and CUDA kernels do that themselves for 16-bit tensors (one call instead
    of five, which counts when decoding a token at a time); elsewhere it is spelled out.
    So is every call whose backward will run: PyTorch 2.13's CPU backward of a bfloat16
    LayerNorm sums ∂γ and ∂β over the rows with bfloat16 partial sums (errors of about
    √N·u_bf16·Σ|terms| where float32's would be 2¹⁶ times smaller; the suite's
    gpt_backward check found it at 126 rows), while the widened call's backward runs in
    float32 and rounds each gradient once. Both paths compute the same forward value."""
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or gamma.requires_grad
                                              or beta.requires_grad)
    if (x.device.type in _WIDENING_LAYER_NORM and gamma.dtype == beta.dtype == x.dtype
            and not (needs_grad and x.dtype in HALF_DTYPES)):
        return F.layer_norm(x, (x.shape[-1],), gamma, beta, eps)
    acc = accumulation_dtype(x.dtype)
    y = F.layer_norm(x.to(acc), (x.shape[-1],), gamma.to(acc), beta.to(acc), eps)
    return y.to(x.dtype)


def relu(x: Tensor) -> Tensor:
    """max(0, x)."""
    return F.relu(x)


def gelu(x: Tensor) -> Tensor:
    """x Φ(x) = x · ½ (1 + erf(x / √2))."""
    return F.gelu(x)


def gelu_tanh(x: Tensor) -> Tensor:
    """½ x (1 + tanh(√(2/π) (x + 0.044715 x³))).

    On the CPU in float32 the one-pass kernel of ``cpu_gelu`` computes it (and keeps its
    derivative for the backward) where that kernel is built; elsewhere PyTorch's."""
    if cpu_gelu.applies_to(x):
        return cpu_gelu.gelu_tanh(x)
    return F.gelu(x, approximate="tanh")


def ffn_relu(x: Tensor, W_1: Matrix, b_1: Tensor | None, W_2: Matrix, b_2: Tensor | None) -> Tensor:
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (Blueprint eq 6)."""
    return linear(relu(linear(x, W_1, b_1)), W_2, b_2)


def ffn_gelu(x: Tensor, W_1: Matrix, b_1: Tensor | None, W_2: Matrix, b_2: Tensor | None) -> Tensor:
    """FFN(x) = GELU(x W_1 + b_1) W_2 + b_2."""
    return linear(gelu(linear(x, W_1, b_1)), W_2, b_2)


def ffn_gelu_tanh(
    x: Tensor, W_1: Matrix, b_1: Tensor | None, W_2: Matrix, b_2: Tensor | None
) -> Tensor:
    """FFN(x) = GELU_tanh(x W_1 + b_1) W_2 + b_2 (GPT-2, GPT-3)."""
    return linear(gelu_tanh(linear(x, W_1, b_1)), W_2, b_2)


def ffn_guide_product(
    x: Tensor, W_1: Matrix, b_1: Tensor | None, W_2: Matrix, b_2: Tensor | None
) -> Tensor:
    """FFNN(x) = σ(x W_1 + b_1) ⊙ σ(x W_2 + b_2) with σ = ReLU (Guide sec. 4, literally)."""
    return relu(linear(x, W_1, b_1)) * relu(linear(x, W_2, b_2))


FFN: dict[str, Callable[..., Tensor]] = {
    "relu": ffn_relu,
    "gelu": ffn_gelu,
    "gelu_tanh": ffn_gelu_tanh,
    "guide_product": ffn_guide_product,
}


# --- blocks --------------------------------------------------------------------------------
# Each residual form is written once, over its sublayers as functions (``residual_*``);
# ``block_*`` applies it to a parameter dict (the reference's signature), and the model's
# Block applies it to its own modules, so both run the same composition.

Sublayer = Callable[[Tensor], Tensor]


def residual_pre_ln(
    H: Tensor, ln_1: Sublayer, attn: Sublayer, ln_2: Sublayer, ffn: Sublayer
) -> Tensor:
    """H' = H + MultiHead(LN_1(H)); H_out = H' + FFN(LN_2(H')) (GPT-2, GPT-3)."""
    H = H + attn(ln_1(H))
    return H + ffn(ln_2(H))


def residual_post_ln(
    H: Tensor, ln_1: Sublayer, attn: Sublayer, ln_2: Sublayer, ffn: Sublayer
) -> Tensor:
    """H' = LN_1(H + MultiHead(H)); H_out = LN_2(H' + FFN(H')) (Blueprint eqs 7–8)."""
    H = ln_1(H + attn(H))
    return ln_2(H + ffn(H))


def residual_guide(
    H: Tensor, ln_1: Sublayer, attn: Sublayer, ln_2: Sublayer | None, ffn: Sublayer
) -> Tensor:
    """H⁽ˡ⁺¹⁾ = LN(FFNN(Attention(H⁽ˡ⁾)) + H⁽ˡ⁾) (Guide sec. 5): one residual, one LayerNorm
    (``ln_2`` is unused)."""
    return ln_1(ffn(attn(H)) + H)


RESIDUAL: dict[str, Callable[..., Tensor]] = {
    "pre": residual_pre_ln,
    "post": residual_post_ln,
    "guide": residual_guide,
}


def _sublayers(
    p: dict[str, Tensor], config: GPTConfig
) -> tuple[Sublayer, Sublayer, Sublayer | None, Sublayer]:
    def ln(which: str) -> Sublayer:
        return lambda X: layer_norm(X, p[f"{which}.weight"], p[f"{which}.bias"], config.ln_eps)

    def attn(X: Tensor) -> Tensor:
        return multi_head_attention(X, p["attn.w_qkv"], p.get("attn.b_qkv"), p["attn.w_o"],
                                    p.get("attn.b_o"), config.n_heads)

    def ffn(X: Tensor) -> Tensor:
        return FFN[config.ffn](X, p["ffn.w_1"], p.get("ffn.b_1"), p["ffn.w_2"], p.get("ffn.b_2"))

    return ln("ln_1"), attn, (ln("ln_2") if "ln_2.weight" in p else None), ffn


def block_pre_ln(H: Tensor, p: dict[str, Tensor], config: GPTConfig) -> Tensor:
    """The pre-LN block on one block's parameters ``p`` (named without ``blocks.{l}.``)."""
    ln_1, attn, ln_2, ffn = _sublayers(p, config)
    if ln_2 is None:
        raise ValueError("block_pre_ln needs the parameters 'ln_2.weight' and 'ln_2.bias'")
    return residual_pre_ln(H, ln_1, attn, ln_2, ffn)


def block_post_ln(H: Tensor, p: dict[str, Tensor], config: GPTConfig) -> Tensor:
    """The post-LN block (Blueprint eqs 7–8) on one block's parameters ``p``."""
    ln_1, attn, ln_2, ffn = _sublayers(p, config)
    if ln_2 is None:
        raise ValueError("block_post_ln needs the parameters 'ln_2.weight' and 'ln_2.bias'")
    return residual_post_ln(H, ln_1, attn, ln_2, ffn)


def block_guide(H: Tensor, p: dict[str, Tensor], config: GPTConfig) -> Tensor:
    """The Guide's block (sec. 5) on one block's parameters ``p``."""
    return residual_guide(H, *_sublayers(p, config))


# --- output --------------------------------------------------------------------------------


def final_layer_norm(H: Tensor, gamma: Tensor, beta: Tensor, eps: float) -> Tensor:
    """H_f = LN_f(H) after the last block (GPT-2, GPT-3)."""
    return layer_norm(H, gamma, beta, eps)


def unembed_tied(H: Tensor, W_E: Matrix, vocab_multiple: int = 1) -> Tensor:
    """logits = H W_Eᵀ (Blueprint eq 9): W_E is already the (out, in) matrix F.linear takes
    (or, as in ``linear``, its prepacked form).

    ``vocab_multiple`` > 1 multiplies by W_E padded with zero rows to a multiple of it and
    slices them off: the same logits. A vocabulary such as GPT-2's 50 257 puts every row of
    the logits and of their gradient off a 16-byte boundary, which denies cuBLAS its fastest
    kernels; compiled training pads (the pad fuses into the 16-bit cast of W_E)."""
    if isinstance(W_E, PackedMatrix):
        return W_E.product(H, None)
    V = W_E.shape[0]
    pad = -V % vocab_multiple
    if pad:
        return F.linear(H, F.pad(W_E, (0, 0, 0, pad)))[..., :V]
    return F.linear(H, W_E)


def unembed_untied(H: Tensor, W_U: Matrix, b_U: Tensor | None = None,
                   vocab_multiple: int = 1) -> Tensor:
    """logits = H W_U + b_U (the Guide's single output projection); ``vocab_multiple`` as
    in ``unembed_tied``."""
    if not isinstance(W_U, PackedMatrix) and W_U.shape[1] % vocab_multiple:
        V = W_U.shape[1]
        pad = -V % vocab_multiple
        b = None if b_U is None else F.pad(b_U, (0, pad))
        return linear(H, F.pad(W_U, (0, pad)), b)[..., :V]
    return linear(H, W_U, b_U)


def next_token_distribution(logits: Tensor) -> Tensor:
    """P(x_{t+1} = v | x_{≤t}) = softmax(logits_t)_v (Blueprint eq 9)."""
    return softmax(logits, axis=-1)


def sequence_log_probability(tokens: Tensor, logits: Tensor) -> Tensor:
    """log P(x_2 … x_T | x_1) = Σ_{t=2}^{T} log P(x_t | x_{<t}) (Blueprint eq 1, conditioned
    on the first token). Row t−1 of ``logits`` predicts x_t. 16-bit logits: the
    log-softmax and the sum run in float32; the result is float32."""
    log_p = torch.log_softmax(logits[..., :-1, :].to(accumulation_dtype(logits.dtype)), dim=-1)
    nxt = tokens[..., 1:].long()
    return log_p.gather(-1, nxt.unsqueeze(-1)).squeeze(-1).sum(dim=-1)
