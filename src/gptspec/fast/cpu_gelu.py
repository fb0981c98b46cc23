"""tanh-GELU on the CPU in float32, forward and derivative in one pass.

PyTorch's CPU tanh-GELU evaluates tanh slowly and passes over the activation twice (the
backward recomputes tanh). The kernel here (``kernels/gelu_tanh.cpp``, AVX2 and FMA)
computes ``y = x σ(2z)`` (½(1 + tanh z) = σ(2z)) and ``dy/dx`` together, so the backward
is one product, ``grad · dy/dx``; ``benchmarks/training.py`` measures the gain. The
conformance suite judges it like everything else (``gelu_tanh``, gradients, training).
Built on first use with ``torch.utils.cpp_extension``, called through ctypes; where it
cannot be (no AVX2/FMA, a failed build: a one-line warning), ``available()`` is False and
``ops.gelu_tanh`` keeps PyTorch's kernel, as in float64, 16-bit and CUDA. A
``torch.library`` operator, so ``torch.compile`` keeps it in its graph; GPTSPEC_GELU_KERNEL=0 turns it off.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from gptspec.fast.native import (
    cpu_flags,
    exclusive_build,
    put_ninja_on_path,
    streams_for_the_build,
)

Tensor = torch.Tensor

SOURCE = Path(__file__).parent / "kernels" / "gelu_tanh.cpp"
NAME = "gptspec_gelu_tanh"


_decided: dict[str, Any] = {}  # "kernel": the C function, or None where there is none


def _kernel() -> Any:
    """The kernel's C function, or None where it is not available (decided once)."""
    if "kernel" not in _decided:
        _decided["kernel"] = _build()
    return _decided["kernel"]


def _build() -> Any:
    if os.environ.get("GPTSPEC_GELU_KERNEL", "1") == "0":
        return None
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    flags = cpu_flags()
    if flags is not None and not {"avx2", "fma"} <= flags:
        return None
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        warnings.warn(f"gptspec: no C++ compiler ({compiler!r}) to build the tanh-GELU kernel "
                      "with; PyTorch's kernel computes it", RuntimeWarning, stacklevel=3)
        return None
    try:
        from torch.utils.cpp_extension import load

        put_ninja_on_path()
        with exclusive_build(NAME), streams_for_the_build():
            load(name=NAME, sources=[str(SOURCE)], is_python_module=False,
                 extra_cflags=["-O2", "-mavx2", "-mfma"])
        # load() opened the library (torch.ops.load_library); ctypes finds it by its path
        path = next(p for p in torch.ops.loaded_libraries if Path(p).stem == NAME)
        function = ctypes.CDLL(path).gptspec_gelu_tanh_f32
    except Exception as error:  # no ninja, a compiler error, …: PyTorch's kernel stays
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        warnings.warn(f"gptspec: the tanh-GELU kernel could not be built ({first_line}); "
                      "PyTorch's kernel computes it", RuntimeWarning, stacklevel=3)
        return None
    function.restype = None
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return function


def available() -> bool:
    """Whether the kernel is built and this CPU runs it."""
    return _kernel() is not None


def applies_to(x: Tensor) -> bool:
    """Whether ``gelu_tanh`` computes ``x`` with the kernel. While torch.compile traces,
    the decision is read, never made (a build cannot be traced): call ``available()``
    before compiling, as ``compile_model`` and the trainer do, and the compiled function
    computes what the eager one does."""
    if x.device.type != "cpu" or x.dtype != torch.float32:
        return False
    if torch.compiler.is_compiling():
        return _decided.get("kernel") is not None
    return available()


# The kernel as PyTorch operators: torch.compile then traces a model that uses it in one
# graph and calls the same kernel, so compiled and eager logits are equal. (Registered with
# torch.library's Library, not its custom_op decorator, whose first call imports
# torch._dynamo and sympy: 1.5 s of a training run's start-up.)
_LIBRARY = torch.library.Library("gptspec_cpu", "FRAGMENT")
_LIBRARY.define("gelu_tanh_f32(Tensor x) -> Tensor")
_LIBRARY.define("gelu_tanh_f32_with_derivative(Tensor x) -> (Tensor, Tensor)")


def _value(x: Tensor) -> Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    _kernel()(x.data_ptr(), y.data_ptr(), None, x.numel())
    return y


def _value_and_derivative(x: Tensor) -> tuple[Tensor, Tensor]:
    x = x.contiguous()
    y, dy = torch.empty_like(x), torch.empty_like(x)
    _kernel()(x.data_ptr(), y.data_ptr(), dy.data_ptr(), x.numel())
    return y, dy


def _contiguous_like(x: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


_LIBRARY.impl("gelu_tanh_f32", _value, "CPU")
_LIBRARY.impl("gelu_tanh_f32_with_derivative", _value_and_derivative, "CPU")
torch.library.register_fake("gptspec_cpu::gelu_tanh_f32", _contiguous_like, lib=_LIBRARY)
torch.library.register_fake("gptspec_cpu::gelu_tanh_f32_with_derivative",
                            lambda x: (_contiguous_like(x), _contiguous_like(x)), lib=_LIBRARY)


class _GeluTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        y, dy = torch.ops.gptspec_cpu.gelu_tanh_f32_with_derivative(x)
        ctx.save_for_backward(x, dy)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        x, dy = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: the product must refuse to be differentiated
            return _FirstDerivativeOnly.apply(grad, dy, x)
        return grad * dy


class _FirstDerivativeOnly(torch.autograd.Function):
    """grad · dy/dx, tied to x so that a second derivative reaches this node and is
    refused: the kernel keeps no y'', and leaving it out would make the answer 0."""

    @staticmethod
    def forward(ctx: Any, grad: Tensor, dy: Tensor, x: Tensor) -> Tensor:
        return grad * dy

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        raise RuntimeError("gptspec's tanh-GELU kernel has no second derivative; set "
                           "GPTSPEC_GELU_KERNEL=0 to differentiate twice with PyTorch's")


def gelu_tanh(x: Tensor) -> Tensor:
    """½ x (1 + tanh(√(2/π) (x + 0.044715 x³))) of a float32 CPU tensor (``applies_to``),
    differentiable once; without a gradient to keep, the forward alone."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _GeluTanh.apply(x)
    return torch.ops.gptspec_cpu.gelu_tanh_f32(x)
