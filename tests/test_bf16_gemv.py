"""gptspec.fast.bf16_gemv: the one-row bfloat16 product of batch-1 decoding.

The kernel must be built wherever the CPU can run it (else generation silently loses its
speed), lay the matrix out as documented, and compute PyTorch's bfloat16 product: within
the derived budget of the exact one (budgets.linear_bound), exact where every partial
sum is representable, NaN and infinity carried through, bad operands refused.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cpu_features import cpu_flags

from gptspec.conformance import budgets as B
from gptspec.fast import bf16_gemv, prepacked
from gptspec.fast.bf16_gemv import BlockedWeight, blocked


def test_the_kernel_is_available_exactly_where_the_cpu_has_avx512_bf16():
    """Read from /proc/cpuinfo, independently of the kernel's own CPUID check: on this
    project's CI machines (AVX-512 BF16) this also proves the kernel builds."""
    assert bf16_gemv.available() == ("avx512_bf16" in cpu_flags())


def test_the_blocked_layout_puts_row_pairs_side_by_side():
    N, K = 19, 6  # neither a multiple of the block (16) nor of the padding (4)
    A = torch.arange(N * K, dtype=torch.float32).reshape(N, K)
    got = blocked(A)
    assert got.shape == (2, 4, 16, 2)  # ⌈19/16⌉ blocks, K' = 8 → 4 pairs
    for b, k, j, i in np.ndindex(*got.shape):
        n, c = 16 * b + j, 2 * k + i
        want = A[n, c] if n < N and c < K else 0.0
        assert got[b, k, j, i] == want, (b, k, j, i)


needs_kernel = pytest.mark.skipif(not bf16_gemv.available(),
                                  reason="this CPU lacks AVX-512 BF16 (checked above)")


def _product(x: torch.Tensor, A: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return BlockedWeight.of(A)(x, b)


@needs_kernel
@pytest.mark.parametrize("n_out, n_in", [(16, 32), (40, 48), (19, 6), (1, 3), (2304, 768)])
@pytest.mark.parametrize("rows", [(1,), (1, 1), (3, 1)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_the_product_is_within_the_bfloat16_budget_of_the_exact_one(n_out, n_in, rows,
                                                                   with_bias):
    gen = torch.Generator().manual_seed(n_out * n_in + len(rows))
    x = torch.randn(*rows, n_in, generator=gen).bfloat16()
    A = torch.randn(n_out, n_in, generator=gen).bfloat16()
    b = torch.randn(n_out, generator=gen).bfloat16() if with_bias else None
    got = _product(x, A, b)
    assert got.shape == (*rows, n_out) and got.dtype == torch.bfloat16
    x64 = x.double().numpy()
    exact, err = B.linear_bound(x64, np.zeros_like(x64), A.double().numpy().T,
                                None if b is None else b.double().numpy(),
                                B.Precision.of("bfloat16"))
    cmp = B.compare(got.double().numpy(), exact, B.budget(err))
    assert cmp.passed, cmp.describe()


@needs_kernel
def test_representable_sums_are_exact_and_rounding_is_to_nearest_even():
    """Small integers: every product and partial sum is exact in float32, so the result is
    the exact sum rounded once; 257 and 259 lie halfway between bfloat16 neighbours."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-4, 5, (1, 100), generator=gen).bfloat16()
    A = torch.randint(-4, 5, (33, 100), generator=gen).bfloat16()
    b = torch.randint(-50, 50, (33,), generator=gen).bfloat16()
    want = (x.double() @ A.double().T + b.double()).bfloat16()
    assert torch.equal(_product(x, A, b), want)
    ones = torch.ones(1, 4).bfloat16()
    halfway = torch.tensor([[64.0, 64.0, 64.0, 64.0], [64.0, 64.0, 64.0, 67.0]]).bfloat16()
    got = _product(ones, halfway, torch.tensor([1.0, 0.0]).bfloat16())
    assert got.tolist() == [[256.0, 260.0]]  # 257 → 256 (even), 259 → 260 (even)


@needs_kernel
def test_nan_and_infinity_are_carried_through():
    x = torch.ones(1, 8).bfloat16()
    A = torch.ones(3, 8).bfloat16()
    A[0, 2] = float("nan")
    A[1, 5] = float("inf")
    got = _product(x, A, None)[0]
    assert torch.isnan(got[0]) and got[1] == float("inf") and got[2] == 8


@needs_kernel
def test_bad_operands_are_refused_with_a_one_line_reason():
    A = torch.randn(16, 8).bfloat16()
    weight = BlockedWeight.of(A)
    with pytest.raises(ValueError, match="x must be a bfloat16 CPU tensor, not torch.float32"):
        weight(torch.randn(1, 8), None)
    with pytest.raises(ValueError, match="x has 12 columns, the blocks 8"):
        weight(torch.randn(1, 12).bfloat16(), None)
    with pytest.raises(ValueError, match="bias must be bfloat16 of 16 values"):
        weight(torch.randn(1, 8).bfloat16(), torch.randn(15).bfloat16())
    with pytest.raises(ValueError, match="bias must be bfloat16"):
        weight(torch.randn(1, 8).bfloat16(), torch.randn(16))


def test_without_a_compiler_a_warning_says_so_and_generation_uses_onednn(tmp_path):
    """A fresh process with no C++ compiler and an empty build cache."""
    import os
    import subprocess
    import sys

    script = (
        "from gptspec.fast import bf16_gemv, prepacked\n"
        "from gptspec.fast.generate import generate\n"
        "from gptspec.fast.model import GPT\n"
        "from gptspec.spec import preset\n"
        "model = GPT(preset('tiny'), dtype='bfloat16').eval().requires_grad_(False)\n"
        "packed = prepacked.for_model(model, rows=1)\n"
        "print(len(generate(model, [[1, 2, 3]], 4)[0]), bf16_gemv.available(),\n"
        "      packed.layout.__name__ if packed else 'unpacked')\n")
    env = dict(os.environ, CXX=str(tmp_path / "no-compiler"),
               TORCH_EXTENSIONS_DIR=str(tmp_path / "build"), GPTSPEC_BF16_GEMV="1")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    # oneDNN's product where it packs bfloat16 here (AVX-512), else PyTorch's unpacked one
    onednn = prepacked.supported("cpu", torch.bfloat16)
    assert done.stdout.split() == ["4", "False", "OneDNNWeight" if onednn else "unpacked"]
    warning = [line for line in done.stderr.splitlines() if "GEMV kernel" in line]
    if "avx512_bf16" in cpu_flags():  # a build was due, and the missing compiler is named
        assert len(warning) == 1 and "no C++ compiler" in warning[0]
    else:  # nothing to build for on this CPU, and so nothing to warn about
        assert warning == []
