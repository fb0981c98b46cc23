"""A bandwidth-bound bfloat16 matrix–vector product for batch-1 decoding on the CPU.

At batch 1 a decoding step reads every weight once, so a product runs at the speed its
weights stream from memory. oneDNN's bfloat16 product (``prepacked``) streams them well
below the memory's bandwidth; the kernel here (``kernels/bf16_gemv.cpp``: AVX-512 BF16,
weights in 16-row blocks read front to back) comes closer. ``benchmarks/generation.py``
measures the gain. The arithmetic is PyTorch's bfloat16 contract: bfloat16 operands,
float32 accumulation, the bias added in float32, one rounding to nearest even. Compiled
on first use with ``torch.utils.cpp_extension``, only where /proc/cpuinfo lists AVX-512
BF16; anywhere else, or if the build fails (a one-line warning), ``available()`` is False
and generation keeps oneDNN's product. ``GPTSPEC_BF16_GEMV=0`` turns the kernel off.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from gptspec.fast.native import (
    cpu_flags,
    exclusive_build,
    put_ninja_on_path,
    streams_for_the_build,
)

Tensor = torch.Tensor

SOURCE = Path(__file__).parent / "kernels" / "bf16_gemv.cpp"
BLOCK_ROWS = 16  # rows of A per block (one AVX-512 register of float32 sums)


@functools.cache
def available() -> bool:
    """Whether the kernel is built and this CPU runs it (decided once per process)."""
    if os.environ.get("GPTSPEC_BF16_GEMV", "1") == "0":
        return False
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    flags = cpu_flags()  # unreadable: build, and the kernel's own CPUID check decides
    if flags is not None and "avx512_bf16" not in flags:  # nothing to build for, no warning
        return False
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        warnings.warn(f"gptspec: no C++ compiler ({compiler!r}) to build the bfloat16 GEMV "
                      "kernel with; batch-1 generation uses oneDNN's product",
                      RuntimeWarning, stacklevel=2)
        return False
    try:
        from torch.utils.cpp_extension import load

        put_ninja_on_path()
        with exclusive_build("gptspec_bf16_gemv"), streams_for_the_build():
            load(name="gptspec_bf16_gemv", sources=[str(SOURCE)], is_python_module=False,
                 extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])
    except Exception as error:  # no compiler, no ninja, …: the oneDNN product stays
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        warnings.warn(f"gptspec: the bfloat16 GEMV kernel could not be built ({first_line}); "
                      "batch-1 generation uses oneDNN's product", RuntimeWarning, stacklevel=2)
        return False
    return bool(torch.ops.gptspec.bf16_gemv_supported())


def blocked(A: Tensor) -> Tensor:
    """A (N, K) in the kernel's layout: (⌈N/16⌉, K'/2, 16, 2), K' = K rounded up to a
    multiple of 4, zero padded; block b, pair k holds A[16b + j, 2k : 2k + 2] at [b, k, j]."""
    N, K = A.shape
    padded_n = -(-N // BLOCK_ROWS) * BLOCK_ROWS
    padded_k = -(-K // 4) * 4
    A = F.pad(A, (0, padded_k - K, 0, padded_n - N))
    return A.reshape(padded_n // BLOCK_ROWS, BLOCK_ROWS, padded_k // 2, 2) \
        .transpose(1, 2).contiguous()


@dataclass(frozen=True)
class BlockedWeight:
    """The (out, in) matrix A of ``y = x Aᵀ + b`` in the kernel's layout."""

    blocks: Tensor
    n_out: int

    one_row_only = True  # the kernel reads the weights once per row of x

    @classmethod
    def of(cls, A: Tensor) -> BlockedWeight:
        return cls(blocked(A), A.shape[0])

    def __call__(self, x: Tensor, bias: Tensor | None) -> Tensor:
        problem = self.refusal(x, bias)
        if problem:
            raise ValueError(f"bf16_gemv: {problem}")
        return torch.ops.gptspec.bf16_gemv(x, self.blocks, bias, self.n_out)

    def refusal(self, x: Tensor, bias: Tensor | None) -> str:
        """Why the kernel cannot take these operands ('' if it can). The kernel checks the
        same, but an error thrown inside it crashed the process on one machine (an H200
        host's Xeon with PyTorch 2.11: a segmentation fault instead of the RuntimeError),
        so operands are refused here, before the call."""
        if x.device.type != "cpu" or x.dtype != torch.bfloat16:
            return f"x must be a bfloat16 CPU tensor, not {x.dtype} on {x.device}"
        padded_k = 2 * self.blocks.shape[1]
        if not x.shape[-1] <= padded_k < x.shape[-1] + 4:
            return f"x has {x.shape[-1]} columns, the blocks {padded_k}"
        if bias is not None and (bias.dtype != torch.bfloat16 or bias.device.type != "cpu"
                                 or bias.numel() != self.n_out or not bias.is_contiguous()):
            return f"bias must be bfloat16 of {self.n_out} values on the CPU"
        return ""
