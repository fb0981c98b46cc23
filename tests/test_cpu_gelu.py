"""gptspec.fast.cpu_gelu: tanh-GELU and its derivative in one pass, float32 on the CPU.

The kernel must be built wherever the CPU can run it (else training silently loses its
speed), compute the function and its derivative within the error their own conditioning
allows (measured against a float64 evaluation that does not cancel), never worse than
PyTorch's kernels, carry NaN and infinity as PyTorch does, handle every length and
layout, and be the path ``ops.gelu_tanh`` takes only where it should. A derivative bug
in it must fail the conformance suite's gradient check.
"""

from __future__ import annotations

import ctypes
import math
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cpu_features import cpu_flags

from gptspec.conformance.runner import run_suite
from gptspec.fast import cpu_gelu, ops
from gptspec.fast.backend import TorchBackend

U = 2.0**-24  # float32 unit roundoff
TINY = 2.0**-126  # float32's smallest normal number: the kernel flushes exp below it
C = math.sqrt(2.0 / math.pi)
A = 0.044715


def _can_build_here() -> bool:
    flags = cpu_flags()
    return (sys.platform == "linux" and platform.machine() == "x86_64"
            and {"avx2", "fma"} <= flags and shutil.which("c++") is not None)


def test_the_kernel_is_available_exactly_where_the_cpu_has_avx2_and_fma():
    """Read from /proc/cpuinfo: on this project's machines (AVX2, a compiler) this also
    proves the kernel builds."""
    assert cpu_gelu.available() == _can_build_here()


needs_kernel = pytest.mark.skipif(not cpu_gelu.available(),
                                  reason="no AVX2/FMA or no compiler here (checked above)")


def _exact(x32: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """y, dy/dx and the conditioning scale of dy, in float64 through σ(±2z): no 1 + tanh
    that cancels for negative x."""
    x = x32.double()
    two_z = 2 * C * (x + A * x**3)
    s, s_neg = torch.sigmoid(two_z), torch.sigmoid(-two_z)
    slope = 2 * C * (1 + 3 * A * x * x)
    product = x * s * s_neg * slope
    # each of x², 2z, e^{-|2z|}, 1/(1+e), the products: a few roundings; an error δ in 2z
    # moves σ(±2z) by |2z|·δ relative
    dy_scale = s + product.abs() * (1 + two_z.abs())
    return x * s, s + product, dy_scale


def _grid() -> torch.Tensor:
    dense = torch.linspace(-12, 12, 2_000_001, dtype=torch.float32)
    tails = torch.tensor([-87.0, -40.0, -20.0, 20.0, 40.0, 1e4, -1e4, 0.0, -0.0, 1e-30, -1e-30,
                          1e-40, -1e-40])
    return torch.cat([dense, tails])


@needs_kernel
def test_the_value_errs_no_more_than_its_roundings_allow():
    """|y − y*| ≤ 10·u·|y*|·(1 + |2z|) + |x|·2⁻¹²⁶: ten roundings on the way, an error in
    2z (a few u relative) moves σ(2z) by |2z| times that, and exp below float32's smallest
    normal number is flushed to 0. (PyTorch's tanh form cancels for x < −4, 1 + tanh z, so
    it is far outside this bound there and is not compared.)"""
    x = _grid()
    want, _, _ = _exact(x)
    two_z = 2 * C * (x.double() + A * x.double() ** 3)
    bound = 10 * U * want.abs() * (1 + two_z.abs()) + x.double().abs() * TINY
    err = (cpu_gelu.gelu_tanh(x).double() - want).abs()
    assert (err / bound.clamp(min=1e-300)).max().item() <= 1.0


@needs_kernel
def test_the_derivative_errs_no_more_than_its_conditioning_allows_and_less_than_pytorch():
    x = _grid()[:2_000_001]  # [−12, 12]
    leaf = x.clone().requires_grad_()
    cpu_gelu.gelu_tanh(leaf).backward(torch.ones_like(x))
    _, want, scale = _exact(x)
    err = (leaf.grad.double() - want).abs()
    bound = 10 * U * scale + (1 + x.double().abs() * 2 * C * (1 + 3 * A * x.double()**2)) * TINY
    assert (err / bound).max().item() <= 1.0
    theirs = x.clone().requires_grad_()
    F.gelu(theirs, approximate="tanh").backward(torch.ones_like(x))
    assert err.max() <= (theirs.grad.double() - want).abs().max()


@needs_kernel
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 15, 17, 64, 1000])
def test_every_length_matches_pytorch_within_a_few_roundings(n):
    """The last n mod 8 values go through a lane mask: none is dropped or read past."""
    x = torch.randn(n + 3, generator=torch.Generator().manual_seed(n))[:n] * 3
    got = cpu_gelu.gelu_tanh(x)
    want = F.gelu(x.double(), approximate="tanh")
    assert got.shape == x.shape
    assert torch.all((got.double() - want).abs() <= 16 * U * (want.abs() + x.double().abs()))


@needs_kernel
def test_non_contiguous_input_and_batched_shapes():
    base = torch.randn(6, 10, 12, generator=torch.Generator().manual_seed(1))
    x = base.transpose(0, 2)[:, ::2]  # strided
    assert not x.is_contiguous()
    got = ops.gelu_tanh(x)
    assert got.shape == x.shape
    assert torch.equal(got, ops.gelu_tanh(x.contiguous()))


@needs_kernel
def test_nan_and_infinity_come_out_as_pytorch_gives_them():
    x = torch.tensor([math.nan, math.inf, -math.inf, 3.4e38, -3.4e38, 100.0, -100.0])
    got, want = cpu_gelu.gelu_tanh(x), F.gelu(x, approximate="tanh")
    assert torch.equal(got.isnan(), want.isnan())
    finite = ~want.isnan()
    assert torch.equal(got[finite], want[finite])


@needs_kernel
def test_the_backward_is_the_gradient_times_the_saved_derivative_and_only_first_order():
    x = torch.randn(300, generator=torch.Generator().manual_seed(2), requires_grad=True)
    g = torch.randn(300, generator=torch.Generator().manual_seed(3))
    y = cpu_gelu.gelu_tanh(x)
    (gx,) = torch.autograd.grad(y, x, g)
    _, dy, _ = _exact(x.detach())
    assert torch.allclose(gx.double(), g.double() * dy, rtol=20 * U, atol=20 * U)
    with torch.no_grad():  # the forward alone: the same values
        assert torch.equal(cpu_gelu.gelu_tanh(x), y.detach())
    # a second derivative would need y'' (not kept): asking for one is an error, never 0
    for v in (g, g.clone().requires_grad_()):
        (gx,) = torch.autograd.grad(cpu_gelu.gelu_tanh(x), x, v, create_graph=True)
        with pytest.raises(RuntimeError, match="no second derivative"):
            torch.autograd.grad((gx * x).sum(), x)


def test_ops_takes_the_kernel_only_for_float32_on_the_cpu():
    x = torch.randn(40, generator=torch.Generator().manual_seed(4))
    assert cpu_gelu.applies_to(x) == cpu_gelu.available()
    for dtype in (torch.float64, torch.bfloat16, torch.float16):
        assert not cpu_gelu.applies_to(x.to(dtype))
        assert torch.equal(ops.gelu_tanh(x.to(dtype)), F.gelu(x.to(dtype), approximate="tanh"))


def test_the_switch_turns_the_kernel_off():
    code = ("import torch, torch.nn.functional as F\n"
            "from gptspec.fast import cpu_gelu, ops\n"
            "x = torch.linspace(-6, 6, 1001)\n"
            "assert not cpu_gelu.available()\n"
            "assert torch.equal(ops.gelu_tanh(x), F.gelu(x, approximate='tanh'))\n")
    env = {**__import__("os").environ, "GPTSPEC_GELU_KERNEL": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@needs_kernel
def test_a_wrong_derivative_in_the_kernel_fails_the_gradient_check(monkeypatch):
    """The realistic slip: the derivative without its product-rule term, dy = σ(2z),
    planted behind the kernel's own C interface."""
    kernel = cpu_gelu._kernel()

    def forgets_the_product_rule(x_ptr, y_ptr, dy_ptr, n):
        kernel(x_ptr, y_ptr, dy_ptr, n)
        if dy_ptr:
            x = np.ctypeslib.as_array((ctypes.c_float * n).from_address(x_ptr)).astype(float)
            dy = np.ctypeslib.as_array((ctypes.c_float * n).from_address(dy_ptr))
            dy[:] = 1 / (1 + np.exp(-2 * C * (x + A * x**3)))

    monkeypatch.setattr(cpu_gelu, "_kernel", lambda: forgets_the_product_rule)
    suite = run_suite(TorchBackend("cpu", "float32"), profile="quick", seed=0, area=None,
                      select=lambda c: c.id == "gpt_backward.long_batch")
    (result,) = suite.results
    assert result.status == "fail", result.detail
    assert np.isfinite(result.worst_fraction) and result.worst_fraction > 1


def test_a_build_lock_left_by_a_killed_builder_is_not_waited_on(tmp_path, monkeypatch):
    """PyTorch's build lock is a file made with O_EXCL: a builder killed in its window left
    it, and every later train, experiment and bfloat16 generate waited on it forever
    (hostile round 7). Under gptspec's own lock (released by a dead holder) it is stale and
    goes; a live holder that keeps its lock past the wait is a one-line TimeoutError."""
    import fcntl
    import os

    from torch.utils.cpp_extension import _get_build_directory

    from gptspec.fast.native import exclusive_build

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = Path(_get_build_directory("gptspec_test_kernel", verbose=False))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lock").touch()  # what a builder killed inside PyTorch's window leaves
    with exclusive_build("gptspec_test_kernel", wait_s=5):
        assert not (folder / "lock").exists()
    holder = os.open(folder / "gptspec.lock", os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another process's build, still running
    try:
        with pytest.raises(TimeoutError, match="held its build for over 0 s"):
            with exclusive_build("gptspec_test_kernel", wait_s=0.3):
                pass
    finally:
        os.close(holder)
