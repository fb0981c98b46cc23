"""Two correct PyTorch backends written differently from the built-in one, for the
soundness gate (a check that fails either is a false alarm).

``RoundedFloat64``, the best a backend of a dtype can do: everything in float64, each
result it hands back rounded to its dtype once (AdamW rounds the stored parameter after
each step, as the spec's 16-bit decision says). ``ExplicitTorch``: the model written out
op by op with float32 upcasts elsewhere than the built-in's: every product upcasts both
16-bit factors and rounds once; attention loops over heads with an unfused float32
softmax whose scores are stored in the dtype; LayerNorm is two explicit float32 passes;
gradients are autograd through this forward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from gptspec.fast.backend import TorchBackend
from gptspec.fast.model import resolve_dtype
from gptspec.spec.config import GPTConfig
from gptspec.spec.parameters import parameter_schema

Tensor = torch.Tensor


class RoundedFloat64(TorchBackend):
    """The built-in backend run in float64, every result rounded once to ``dtype``."""

    name = "torch-float64-rounded"

    def __init__(self, device: str = "cpu", dtype: str = "float32") -> None:
        super().__init__(device, "float64")
        self.target = resolve_dtype(dtype)
        self.dtype = str(self.target).removeprefix("torch.")

    def _round(self, t: Tensor) -> Tensor:
        return t.to(self.target).to(torch.float64) if t.is_floating_point() else t

    def _to_numpy(self, t: Tensor) -> np.ndarray:  # type: ignore[override]
        return TorchBackend._to_numpy(self._round(t.detach()))

    def gpt_backward(self, tokens: Any, targets: Any, params: Mapping[str, Any],
                     config: GPTConfig) -> tuple[float, dict[str, np.ndarray]]:
        loss, grads = super().gpt_backward(tokens, targets, params, config)
        rounded = {k: self._to_numpy(torch.as_tensor(g)) for k, g in grads.items()}
        return float(self._to_numpy(torch.tensor(loss))), rounded

    def adamw_trajectory(self, params: Mapping[str, Any], grads: list, lrs: list,
                         beta1: float, beta2: float, eps: float, weight_decay: float) -> list:
        tensors = {k: torch.nn.Parameter(torch.tensor(np.asarray(v), dtype=torch.float64))
                   for k, v in params.items()}
        opt = torch.optim.AdamW(list(tensors.values()), lr=lrs[0], betas=(beta1, beta2),
                                eps=eps, weight_decay=weight_decay)
        out = []
        for g, lr in zip(grads, lrs, strict=True):
            for k, p in tensors.items():
                p.grad = torch.tensor(np.asarray(g[k]), dtype=torch.float64)
            opt.param_groups[0]["lr"] = lr
            opt.step()
            with torch.no_grad():
                for p in tensors.values():
                    p.copy_(self._round(p))
            out.append({k: p.detach().numpy().copy() for k, p in tensors.items()})
        return out

    def sampling_distribution(self, z: Any, temperature: float = 1.0, top_k: int | None = None,
                              top_p: float | None = None) -> np.ndarray:
        """Rounded to float32 at least: the suite's sampling contract (16-bit logits are
        widened before sampling, conformance/checks_sampling.py)."""
        from gptspec.fast.sampling import sampling_distribution

        with torch.no_grad():
            q = sampling_distribution(self._to_torch(np.asarray(z)), temperature, top_k, top_p)
        wide = torch.float32 if self.target in (torch.float16, torch.bfloat16) else self.target
        return q.to(wide).double().numpy()

    def kv_cache_nbytes(self, config: GPTConfig, batch: int) -> int:
        from gptspec.fast import measure

        return measure.kv_cache_nbytes(config, batch, self.target)


# --- the explicit model -----------------------------------------------------------------------


def _wide(t: Tensor) -> Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def linear(x: Tensor, W: Tensor, b: Tensor | None = None) -> Tensor:
    y = _wide(x) @ _wide(W)
    return (y if b is None else y + _wide(b)).to(x.dtype)


def softmax(z: Tensor, axis: int = -1) -> Tensor:
    w = _wide(z)
    e = torch.exp(w - w.amax(dim=axis, keepdim=True))
    return (e / e.sum(dim=axis, keepdim=True)).to(z.dtype)


def layer_norm(x: Tensor, gamma: Tensor, beta: Tensor, eps: float) -> Tensor:
    w = _wide(x)
    centred = w - w.sum(dim=-1, keepdim=True) / w.shape[-1]
    var = (centred * centred).sum(dim=-1, keepdim=True) / w.shape[-1]
    return (centred / torch.sqrt(var + eps) * _wide(gamma) + _wide(beta)).to(x.dtype)


def gelu(x: Tensor) -> Tensor:
    w = _wide(x)
    return (w * (0.5 + 0.5 * torch.erf(w * (1 / math.sqrt(2))))).to(x.dtype)


def gelu_tanh(x: Tensor) -> Tensor:
    w = _wide(x)
    inner = math.sqrt(2 / math.pi) * w * (1 + 0.044715 * w * w)
    return (0.5 * w * (1 + torch.tanh(inner))).to(x.dtype)


def relu(x: Tensor) -> Tensor:
    return torch.where(x > 0, x, torch.zeros_like(x))


def attention_weights(Q: Tensor, K: Tensor, M: Tensor) -> Tensor:
    scores = (_wide(Q) @ _wide(K).transpose(-1, -2) / math.sqrt(Q.shape[-1])).to(Q.dtype)
    return softmax(scores + M.to(Q.dtype))


def scaled_dot_product_attention(Q: Tensor, K: Tensor, V: Tensor, M: Tensor) -> Tensor:
    return (_wide(attention_weights(Q, K, M)) @ _wide(V)).to(Q.dtype)


def _mask(T: int, dtype: torch.dtype) -> Tensor:
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    return torch.zeros(T, T, dtype=dtype).masked_fill(future, float("-inf"))


def multi_head_attention(H: Tensor, W_qkv: Tensor, b_qkv: Tensor | None, W_O: Tensor,
                         b_O: Tensor | None, n_heads: int) -> Tensor:
    """One head at a time, the heads' outputs concatenated."""
    d = W_O.shape[0]  # h·d_k, the width of Q, K and V
    dk = d // n_heads
    QKV = linear(H, W_qkv, b_qkv)
    M = _mask(H.shape[-2], H.dtype)
    heads = []
    for h in range(n_heads):
        q, k, v = (QKV[..., i * d + h * dk:i * d + (h + 1) * dk] for i in range(3))
        heads.append(scaled_dot_product_attention(q, k, v, M))
    return linear(torch.cat(heads, dim=-1), W_O, b_O)


def ffn(variant: str, x: Tensor, W_1: Tensor, b_1: Tensor | None, W_2: Tensor,
        b_2: Tensor | None) -> Tensor:
    if variant == "guide_product":
        return relu(linear(x, W_1, b_1)) * relu(linear(x, W_2, b_2))
    act = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh}[variant]
    return linear(act(linear(x, W_1, b_1)), W_2, b_2)


def gpt_forward(tokens: Tensor, p: Mapping[str, Tensor], config: GPTConfig) -> Tensor:
    T = tokens.shape[-1]
    # the rows gathered from float32 copies: the gradient of a repeated token's rows is
    # then summed in float32 and rounded once (indexing a 16-bit table would sum them in
    # its dtype, one row at a time)
    E = _wide(p["wte"])[tokens]
    H = (E + _wide(p["wpe"])[:T] if config.positional_embedding else E).to(p["wte"].dtype)
    for layer in range(config.n_layers):
        q = {k.removeprefix(f"blocks.{layer}."): v for k, v in p.items()
             if k.startswith(f"blocks.{layer}.")}

        def ln(X: Tensor, which: str, q: dict = q) -> Tensor:
            return layer_norm(X, q[f"{which}.weight"], q[f"{which}.bias"], config.ln_eps)

        def attn(X: Tensor, q: dict = q) -> Tensor:
            return multi_head_attention(X, q["attn.w_qkv"], q.get("attn.b_qkv"), q["attn.w_o"],
                                        q.get("attn.b_o"), config.n_heads)

        def mlp(X: Tensor, q: dict = q) -> Tensor:
            return ffn(config.ffn, X, q["ffn.w_1"], q.get("ffn.b_1"), q["ffn.w_2"],
                       q.get("ffn.b_2"))

        if config.norm == "pre":
            H = H + attn(ln(H, "ln_1"))
            H = H + mlp(ln(H, "ln_2"))
        elif config.norm == "post":
            H = ln(H + attn(H), "ln_1")
            H = ln(H + mlp(H), "ln_2")
        else:
            H = ln(mlp(attn(H)) + H, "ln_1")
    if config.final_norm:
        H = layer_norm(H, p["ln_f.weight"], p["ln_f.bias"], config.ln_eps)
    if config.tied_embeddings:
        return linear(H, p["wte"].transpose(0, 1))
    return linear(H, p["w_u"], p.get("b_u"))


class ExplicitTorch:
    """The model and its main operations written out again in torch (see the module doc)."""

    protocol_version = 2  # gptspec.conformance.protocol: forward(tokens, params, config)
    name = "torch-explicit"
    device = "cpu"

    def __init__(self, device: str = "cpu", dtype: str = "float32") -> None:
        self.torch_dtype = resolve_dtype(dtype)
        self.dtype = str(self.torch_dtype).removeprefix("torch.")
        self.version = f"soundness gate, torch {torch.__version__}"

    def _in(self, x: Any) -> Any:
        if isinstance(x, np.ndarray | np.generic):
            if np.asarray(x).dtype.kind in "iub":
                return torch.as_tensor(np.asarray(x, dtype=np.int64))
            return torch.as_tensor(np.asarray(x, dtype=np.float64)).to(self.torch_dtype)
        return x

    @staticmethod
    def _out(t: Tensor) -> np.ndarray:
        return t.detach().to(torch.float64).numpy()

    def _op(self, fn: Callable[..., Tensor]) -> Callable[..., np.ndarray]:
        def op(*args: Any, **kwargs: Any) -> np.ndarray:
            with torch.no_grad():
                return self._out(fn(*(self._in(a) for a in args), **kwargs))
        return op

    def __getattr__(self, name: str) -> Callable[..., Any]:
        ops = {"linear": linear, "softmax": softmax, "layer_norm": layer_norm, "gelu": gelu,
               "gelu_tanh": gelu_tanh, "relu": relu, "attention_weights": attention_weights,
               "scaled_dot_product_attention": scaled_dot_product_attention,
               "multi_head_attention": multi_head_attention,
               "ffn_relu": lambda *a: ffn("relu", *a), "ffn_gelu": lambda *a: ffn("gelu", *a),
               "ffn_gelu_tanh": lambda *a: ffn("gelu_tanh", *a),
               "ffn_guide_product": lambda *a: ffn("guide_product", *a)}
        if name in ops:
            return self._op(ops[name])
        raise AttributeError(name)

    def _params(self, params: Mapping[str, Any], grad: bool = False) -> dict[str, Tensor]:
        return {k: self._in(np.asarray(v)).requires_grad_(grad) for k, v in params.items()}

    def forward(self, tokens: Any, params: Mapping[str, Any], config: GPTConfig) -> np.ndarray:
        with torch.no_grad():
            return self._out(gpt_forward(self._in(np.asarray(tokens)), self._params(params),
                                         config))

    def gpt_backward(self, tokens: Any, targets: Any, params: Mapping[str, Any],
                     config: GPTConfig) -> tuple[float, dict[str, np.ndarray]]:
        p = self._params(params, grad=True)
        logits = _wide(gpt_forward(self._in(np.asarray(tokens)), p, config))
        log_p = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
        picked = log_p.gather(-1, self._in(np.asarray(targets))[..., None])
        loss = -picked.mean()
        loss.backward()
        return float(loss.detach()), {s.name: self._out(p[s.name].grad)
                             for s in parameter_schema(config)}
