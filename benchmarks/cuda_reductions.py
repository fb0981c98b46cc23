"""On CUDA: are 16-bit matrix products summed in float32? The two thorough-bfloat16
failures of the first H100 run (qkv_projection with K = 1023, unembed_untied with K = 10,
inputs of magnitude 1000 whose products cancel) recomputed under PyTorch's two settings of
``allow_bf16_reduced_precision_reduction`` (on by default), each as a fraction of the
suite's budget for a float32 sum (√K·2⁻²⁴·(|x||W| + |b|), plus 2⁻⁸·|y| for the stored
result, λ = 10 not applied). The CPU's product is printed beside them.

    python -m benchmarks.cuda_reductions
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gptspec.conformance.strategies import ArrayRecipe

CASES = {
    "qkv_projection, K=1023": (ArrayRecipe((2, 1023), "normal", 1.0, 0),
                               ArrayRecipe((1023, 3069), "large", 1000.0, 0),
                               ArrayRecipe((3069,), "large", 1000.0, 0)),
    "unembed_untied, K=10": (ArrayRecipe((6, 10), "large", 1000.0, 0),
                             ArrayRecipe((10, 10), "large", 1000.0, 0), None),
}


def fraction(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, device: str) -> float:
    """max |y − exact| / scale of y = x W + b computed in bfloat16 on ``device``."""
    x64, W64 = x.double(), W.double()
    b64 = torch.zeros(W.shape[1], dtype=torch.float64) if b is None else b.double()
    exact = x64 @ W64 + b64
    scale = (W.shape[0] ** 0.5 * 2.0**-24 * (x64.abs() @ W64.abs() + b64.abs())
             + 2.0**-8 * exact.abs())
    y = F.linear(x.to(device), W.to(device).T, None if b is None else b.to(device))
    return float(((y.double().cpu() - exact).abs() / scale).max())


def main() -> None:
    matmul = torch.backends.cuda.matmul
    for name, (rx, rW, rb) in CASES.items():
        x, W = (torch.as_tensor(r.make()).bfloat16() for r in (rx, rW))
        b = None if rb is None else torch.as_tensor(rb.make()).bfloat16()
        row = [f"cpu {fraction(x, W, b, 'cpu'):.3g}"]
        if torch.cuda.is_available():
            for allowed in (True, False):
                matmul.allow_bf16_reduced_precision_reduction = allowed
                row.append(f"cuda, reduced-precision reduction {'on' if allowed else 'off'} "
                           f"{fraction(x, W, b, 'cuda'):.3g}")
            matmul.allow_bf16_reduced_precision_reduction = True
        print(f"{name}: " + "; ".join(row), flush=True)


if __name__ == "__main__":
    main()
