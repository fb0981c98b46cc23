"""The built-in backend with one of PyTorch's fused attention kernels forced, for checking
it on CUDA: ``torch-flash`` and ``torch-efficient``, through ``sdpa_kernel``.

A forced kernel raises instead of falling back, so a check that passes really ran it. An
attention call whose mask is exactly the causal mask is given ``is_causal=True`` (the
same function, computed by the kernel under test); any other mask is passed on (and
refused by FlashAttention: an error naming the kernel). Inputs of other ranks are
reshaped to the kernels' 4-D (batch, heads, T, d_k) and back (a view), and head widths
are zero-padded to the kernels' alignment (HEAD_ALIGNMENT).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from gptspec.fast import ops
from gptspec.fast.backend import TorchBackend
from meta.mutants import patched_ops

KERNELS = ("flash", "efficient")
# On CUDA the memory-efficient kernel refuses a head width that is not a multiple of 8
# (PyTorch's FlashAttention pads to one itself). Zero columns appended to Q and K leave
# every score Q Kᵀ as it is, and to V add output columns that are cut off, so padding
# lets the kernel take every width the suite draws; the scale stays 1/√d_k of the real
# width, passed explicitly.
HEAD_ALIGNMENT = 8


def _kernel(name: str) -> Any:
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]


def _is_causal_mask(M: Any, T: int, S: int) -> bool:
    if not isinstance(M, torch.Tensor) or M.dim() != 2 or M.shape != (T, S) or T != S:
        return False
    causal = torch.full((T, T), -math.inf, dtype=M.dtype, device=M.device).triu(1)
    return bool(torch.equal(M, causal))


def _four_axes(X: torch.Tensor) -> torch.Tensor:
    return X.reshape(-1, *X.shape[-3:]) if X.dim() >= 3 else X.reshape(1, 1, *X.shape)


def _padded(X: torch.Tensor) -> torch.Tensor:
    """X with zero columns appended up to a multiple of HEAD_ALIGNMENT."""
    return torch.nn.functional.pad(X, (0, -X.shape[-1] % HEAD_ALIGNMENT))


def _sdpa_causal_flag(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                      M: torch.Tensor | None = None, *, is_causal: bool = False) -> torch.Tensor:
    if M is not None and _is_causal_mask(M, Q.shape[-2], K.shape[-2]):
        M, is_causal = None, True
    d_k, d_v = Q.shape[-1], V.shape[-1]
    out = torch.nn.functional.scaled_dot_product_attention(
        _padded(_four_axes(Q)), _padded(_four_axes(K)), _padded(_four_axes(V)),
        attn_mask=M, is_causal=is_causal, scale=1 / math.sqrt(d_k))
    return out[..., :d_v].reshape(*Q.shape[:-1], d_v)


class SDPAKernelBackend(TorchBackend):
    """TorchBackend with every attention call run by one forced fused kernel."""

    def __init__(self, device: str = "cuda", dtype: str = "bfloat16",
                 kernel: str = "flash") -> None:
        if kernel not in KERNELS:
            raise ValueError(f"unknown SDPA kernel {kernel!r}; known: {', '.join(KERNELS)}")
        super().__init__(device=device, dtype=dtype)
        self.kernel = kernel
        self.name = f"torch-{kernel}"

    def _forced(self) -> Any:
        from torch.nn.attention import sdpa_kernel

        return sdpa_kernel([_kernel(self.kernel)])

    def forward(self, tokens: Any, params: Any, config: Any) -> Any:
        with self._forced(), patched_ops({"scaled_dot_product_attention": _sdpa_causal_flag}):
            return super().forward(tokens, params, config)

    def _wrap(self, name: str) -> Callable[..., Any]:
        def op(*args: Any, **kwargs: Any) -> Any:
            with self._forced(), patched_ops({"scaled_dot_product_attention": _sdpa_causal_flag}):
                return TorchBackend._wrap(self, name)(*args, **kwargs)

        op.__name__ = op.__qualname__ = name
        op.__doc__ = getattr(ops, name).__doc__
        return op


def flash(device: str = "cuda", dtype: str = "bfloat16") -> SDPAKernelBackend:
    return SDPAKernelBackend(device, dtype, "flash")


def efficient(device: str = "cuda", dtype: str = "float32") -> SDPAKernelBackend:
    return SDPAKernelBackend(device, dtype, "efficient")
