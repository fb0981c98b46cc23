"""Weight matrices packed once for 16-bit decoding on the CPU: faster, same products.

A decoding step reads every weight once; bfloat16 halves those bytes, but PyTorch's
16-bit CPU matmul reorders the weight into oneDNN's layout on every call. Packing ahead
of time keeps the saving: ``OneDNNWeight`` (oneDNN's layout) or ``BlockedWeight`` (the
one-row GEMV of ``gptspec.fast.bf16_gemv``). Both accumulate in float32 and round once,
as ``ops.linear`` does, so the dtype's budgets apply unchanged. ``bind(model)``
(generation, while it runs) has the model's modules multiply by them; a parameter
changed since (version counter) or needing a gradient takes the plain product.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from gptspec.fast import bf16_gemv
from gptspec.fast.bf16_gemv import BlockedWeight

if TYPE_CHECKING:  # the model's modules import ops, which imports this module
    from gptspec.fast.model import GPT

Tensor = torch.Tensor


def supported(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether weights of this device and dtype can be packed (and are worth packing)."""
    if torch.device(device).type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported()) and _reorders(dtype)
    return False


@functools.cache
def _reorders(dtype: torch.dtype) -> bool:
    """Whether oneDNN really reorders a weight of this dtype here: its fp16 check passes on
    AVX-512 CPUs whose reorder then refuses fp16 without avx_ne_convert or avx512_fp16."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), 1)
    except RuntimeError:
        return False
    return True


@dataclass(frozen=True)
class OneDNNWeight:
    """The (out, in) matrix A of ``y = x Aᵀ + b`` reordered into oneDNN's blocked layout."""

    packed: Tensor

    one_row_only = False

    @classmethod
    def of(cls, A: Tensor) -> OneDNNWeight:
        # the second argument is a batch-size hint for the layout; decoding multiplies few rows
        return cls(torch.ops.mkldnn._reorder_linear_weight(A, 1))

    def __call__(self, x: Tensor, bias: Tensor | None) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")


@dataclass(frozen=True)
class PackedMatrix:
    """A parameter's matrix as the (out, in) operand of ``y = x Aᵀ + b``, packed.

    ``transposed`` says how the parameter is used: True for ``ops.linear``'s (in, out)
    weights (A = Wᵀ), False for the tied unembedding's W_E, already (out, in)."""

    parameter: Tensor
    version: int  # the parameter's in-place version counter when packed
    data_ptr: int  # and its storage (``p.data = …`` replaces it without a version bump)
    transposed: bool
    weight: OneDNNWeight | BlockedWeight

    @classmethod
    def of(cls, parameter: Tensor, transposed: bool,
           layout: type[OneDNNWeight] | type[BlockedWeight] = OneDNNWeight) -> PackedMatrix:
        A = parameter.detach()
        return cls(parameter, parameter._version, parameter.data_ptr(), transposed,
                   layout.of((A.t() if transposed else A).contiguous()))

    @property
    def current(self) -> bool:
        p = self.parameter
        return p._version == self.version and p.data_ptr() == self.data_ptr

    def applies_to(self, x: Tensor) -> bool:
        """Whether the packed kernel may multiply ``x``: the parameter current (unchanged
        since packing), x of its dtype and device, rows its layout takes (the GEMV kernel:
        one), and no gradient to record (the kernel has no backward)."""
        p = self.parameter
        return (self.current and x.dtype == p.dtype and x.device == p.device
                and (not self.weight.one_row_only or x.numel() == x.shape[-1])
                and not (torch.is_grad_enabled() and (x.requires_grad or p.requires_grad)))

    def product(self, x: Tensor, bias: Tensor | None) -> Tensor:
        """x Aᵀ + b: the packed kernel where it applies, else the plain product."""
        if self.applies_to(x):
            return self(x, bias)
        A = self.parameter
        return F.linear(x, A.t() if self.transposed else A, bias)

    def __call__(self, x: Tensor, bias: Tensor | None) -> Tensor:
        """The packed kernel itself (``product`` decides whether it applies)."""
        return self.weight(x, bias)


class PrepackedWeights:
    """Packed copies of a model's weight matrices (memory: one more copy of them).

    ``model`` is a ``gptspec.fast.model.GPT``."""

    def __init__(self, model: GPT,
                 layout: type[OneDNNWeight] | type[BlockedWeight] = OneDNNWeight) -> None:
        self.layout = layout
        self.table = {id(p): PackedMatrix.of(p, transposed, layout)
                      for p, transposed in _matrices(model)}

    def current_for(self, model: GPT) -> bool:
        """Packed from exactly these parameters, none changed since (a dtype or device move
        replaces every parameter's storage, so it makes them all stale)."""
        return [id(p) for p, _ in _matrices(model)] == list(self.table) and \
            all(matrix.current for matrix in self.table.values())

    def operand(self, W: Tensor) -> Tensor | PackedMatrix:
        """What to pass to ``ops.linear`` or ``ops.unembed_tied`` for the parameter W: its
        packed matrix, or W itself where it has none (a table, a vector)."""
        packed = self.table.get(id(W))
        return packed if packed is not None and packed.parameter is W else W


def _matrices(model: GPT) -> Iterator[tuple[Tensor, bool]]:
    """Every weight matrix a forward pass multiplies by, and whether ``ops.linear`` uses
    it transposed: all but the tables (W_P, and W_E unless it is the tied unembedding,
    which uses it as it is)."""
    for name, p in model.named_parameters():
        if name == "wte" and model.config.tied_embeddings:
            yield p, False
        elif p.ndim == 2 and name not in ("wte", "wpe"):
            yield p, True


def operand(module: torch.nn.Module, W: Tensor) -> Tensor | PackedMatrix:
    """What ``module`` passes to ``ops.linear`` or ``ops.unembed_tied`` as its parameter W:
    the packed matrix that ``bind`` bound, or W itself."""
    packed: PrepackedWeights | None = module.__dict__.get(_BOUND)
    return W if packed is None else packed.operand(W)


_BOUND = "_prepacked_bound"  # a module's binding: not a submodule or buffer, never saved


def bind(model: GPT, rows: int | None = None) -> PrepackedWeights | None:
    """Bind the model's packed weights (``for_model``) to its modules, which multiply by
    them from then on (``unbind`` ends it), or unbind where there are none. Returns them."""
    unbind(model)  # the old binding's references go before a new copy is packed
    packed = for_model(model, rows)
    if packed is not None:
        for module in model.modules():
            module.__dict__[_BOUND] = packed
    return packed


def unbind(model: GPT) -> None:
    """The modules multiply by their parameters as they are again."""
    for module in model.modules():
        module.__dict__.pop(_BOUND, None)


def for_model(model: GPT, rows: int | None = None) -> PrepackedWeights | None:
    """The model's packed weights (kept on the model, rebuilt once stale), or None where
    its device and dtype gain nothing from packing. ``rows``: how many rows the products
    will multiply, if known; 1 (batch-1 decoding) in bfloat16 picks the GEMV kernel's
    layout where it is available (``gptspec.fast.bf16_gemv``), anything else oneDNN's."""
    wte = model.wte
    # made under inference_mode, the weights have no version counter to tell staleness
    if not supported(wte.device, wte.dtype) or wte.is_inference():
        return None
    one_row = rows == 1 and wte.dtype == torch.bfloat16 and bf16_gemv.available()
    layout = BlockedWeight if one_row else OneDNNWeight
    packed = model.__dict__.get("_prepacked_weights")
    if packed is None or packed.layout is not layout or not packed.current_for(model):
        # one packed copy at a time, kept on the model (not a submodule or buffer: never
        # saved): every reference to the old one is dropped before the new one is built
        model.__dict__.pop("_prepacked_weights", None)
        del packed
        packed = model.__dict__["_prepacked_weights"] = PrepackedWeights(model, layout)
    return packed
