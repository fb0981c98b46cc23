"""gptspec.fast.prepacked: 16-bit CPU weights reordered once for oneDNN, used by generation.

The packed product must be ops.linear's product (within the dtype's derived budget of the
exact one), used only where it is meant to be (bound by ``bind``, no gradient, current
parameters), and actually used by generation, whose conformance in bfloat16
(tests/test_conformance.py) then covers it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gptspec.conformance import budgets as B
from gptspec.fast import bf16_gemv, ops, prepacked
from gptspec.fast.bf16_gemv import BlockedWeight
from gptspec.fast.generate import GREEDY, generate, stream
from gptspec.fast.model import GPT
from gptspec.fast.prepacked import OneDNNWeight, PackedMatrix, PrepackedWeights
from gptspec.spec import preset

HALF = ["bfloat16", "float16"]
# the 16-bit dtypes oneDNN packs on this CPU (float16 needs avx_ne_convert or avx512_fp16);
# test_unpackable_dtypes_generate_unpacked covers the others
PACKABLE = [d for d in HALF if prepacked.supported("cpu", getattr(torch, d))]


def _model(dtype: str, name: str = "tiny", seed: int = 0) -> GPT:
    return GPT(preset(name), seed=seed, dtype=dtype).eval().requires_grad_(False)


@pytest.fixture
def packed_calls(monkeypatch):
    """How many products ran through a packed matrix."""
    calls: list[tuple[int, ...]] = []
    original = PackedMatrix.__call__

    def spy(self, x, bias):
        calls.append(tuple(x.shape))
        return original(self, x, bias)

    monkeypatch.setattr(PackedMatrix, "__call__", spy)
    return calls


@pytest.mark.parametrize("dtype", PACKABLE)
@pytest.mark.parametrize("shape", [(1, 48), (3, 1, 48), (2, 5, 48)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_packed_product_is_the_linear_product(dtype, shape, with_bias, packed_calls):
    """y = x W + b through the packed matrix, within the dtype's budget of the exact
    product (budgets.linear_bound: √n·u_acc accumulation, one rounding of y)."""
    gen = torch.Generator().manual_seed(len(shape))
    x = torch.randn(*shape, generator=gen).to(getattr(torch, dtype))
    W = torch.nn.Parameter(torch.randn(48, 40, generator=gen).to(x.dtype), requires_grad=False)
    b = torch.randn(40, generator=gen).to(x.dtype) if with_bias else None

    class Holder(torch.nn.Module):  # the parameters' shape of a model: one linear weight
        def __init__(self) -> None:
            super().__init__()
            self.w_o, self.wte = W, torch.nn.Parameter(torch.zeros(1, 48, dtype=x.dtype))
            self.config = preset("tiny")

    got = ops.linear(x, PrepackedWeights(Holder()).operand(W), b)
    assert packed_calls == [shape]
    x64, W64 = x.double().numpy(), W.double().numpy()
    b64 = None if b is None else b.double().numpy()
    exact, err = B.linear_bound(x64, np.zeros_like(x64), W64, b64, B.Precision.of(dtype))
    cmp = B.compare(got.double().numpy(), exact, B.budget(err))
    assert got.dtype == x.dtype and cmp.passed, cmp.describe()


@pytest.mark.parametrize("dtype", PACKABLE)
def test_tied_unembedding_uses_packed_embedding(dtype, packed_calls):
    model = _model(dtype)
    H = torch.randn(2, 3, model.config.d_model).to(model.wte.dtype)
    got = ops.unembed_tied(H, prepacked.for_model(model).operand(model.wte))  # type: ignore[union-attr]
    assert packed_calls == [(2, 3, model.config.d_model)]
    want = torch.nn.functional.linear(H.double(), model.wte.double())
    # both round the same float32-accumulated sums: within two bf16/fp16 roundings
    u = B.Precision.of(dtype).u
    assert torch.allclose(got.double(), want, rtol=4 * u, atol=4 * u * want.abs().max().item())


def test_nothing_is_packed_unless_bound(packed_calls):
    """With packed weights built, a plain weight and the forward of a model they are not
    bound to still take PyTorch's product; bound, every product of the forward takes its
    packed matrix, until unbound."""
    model = _model("bfloat16")
    prepacked.for_model(model)
    x = torch.randn(1, model.config.d_model).to(torch.bfloat16)
    ops.linear(x, model.blocks[0].attn.w_o)
    tokens = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        want = model(tokens)
        assert packed_calls == []
        if prepacked.bind(model) is not None:  # oneDNN packs bfloat16 here
            got = model(tokens)
            assert len(packed_calls) == 4 * model.config.n_layers + 1
            u = B.Precision.of("bfloat16").u
            assert torch.allclose(got.float(), want.float(), rtol=0,
                                  atol=16 * u * want.float().abs().max().item())
        prepacked.unbind(model)
        packed_calls.clear()
        model(tokens)
    assert packed_calls == []


@pytest.mark.parametrize("dtype", PACKABLE)
@pytest.mark.parametrize("batch", [1, 2])
def test_generation_multiplies_by_packed_weights_and_only_inside_its_calls(dtype, batch,
                                                                          packed_calls):
    """Every linear product of a 16-bit CPU generation goes through a packed matrix, but
    the prompt's at batch 1 in bfloat16 where the one-row GEMV kernel is available (its
    layout is for one row; the prompt's product takes PyTorch's)."""
    model = _model(dtype)
    prompts = [[1, 2, 3]] * batch
    n_products_per_forward = 4 * model.config.n_layers + 1  # qkv, out, ffn 1, ffn 2; unembed
    steps = 0
    for _ in stream(model, prompts, 5, GREEDY):
        steps += 1
    assert steps == 5
    one_row_layout = batch == 1 and dtype == "bfloat16" and bf16_gemv.available()
    layout = prepacked.for_model(model, rows=batch).layout  # type: ignore[union-attr]
    assert layout is (BlockedWeight if one_row_layout else OneDNNWeight)
    # the prompt's forward, then one per new token but the last
    assert len(packed_calls) == (4 if one_row_layout else 5) * n_products_per_forward
    assert all(shape[:-1] == (batch, 1) for shape in packed_calls[-4 * n_products_per_forward:])
    packed_calls.clear()
    model(torch.tensor(prompts))  # generation unbound them when it ended
    generate(model, prompts, 5, GREEDY, prepack=False)
    assert packed_calls == []


@pytest.mark.parametrize("dtype", PACKABLE)
def test_packed_generation_equals_unpacked(dtype):
    """The same tokens, and logits within two roundings of the dtype (both paths
    accumulate in float32 and round once; the kernels may differ in order)."""
    model = _model(dtype, "tiny-guide")
    prompts = [[5, 6, 7, 8], [9]]
    a, la = generate(model, prompts, 12, GREEDY, return_logits=True)
    b, lb = generate(model, prompts, 12, GREEDY, return_logits=True, prepack=False)
    assert a == b
    u = B.Precision.of(dtype).u
    for x, y in zip(la, lb, strict=True):
        assert torch.allclose(x, y, rtol=0, atol=8 * u * y.abs().max().item())


@pytest.mark.parametrize("dtype", PACKABLE)
def test_changed_parameters_are_repacked(dtype, packed_calls):
    """A parameter changed in place (a training step) makes its packed copy stale: it is
    not used, and for_model packs again; generation then uses the new weights."""
    model = _model(dtype)
    packed = prepacked.for_model(model)
    assert packed is not None and prepacked.for_model(model) is packed  # kept while current
    w_o = model.blocks[0].attn.w_o
    with torch.no_grad():
        w_o.mul_(-3.0)
    x = torch.randn(1, model.config.d_model).to(model.wte.dtype)
    stale = ops.linear(x, packed.operand(w_o))
    assert packed_calls == []  # the stale copy was bypassed
    assert torch.equal(stale, torch.nn.functional.linear(x, w_o.t()))
    fresh = prepacked.for_model(model)
    assert fresh is not packed and fresh is not None and fresh.current_for(model)
    with torch.no_grad():  # storage replaced without a version bump
        w_o.data = w_o.data.clone() * 2
    assert not fresh.current_for(model)
    got = generate(model, [[1, 2, 3]], 8, GREEDY)
    want = generate(model, [[1, 2, 3]], 8, GREEDY, prepack=False)
    assert got == want


@pytest.mark.parametrize("dtype", PACKABLE)
def test_gradients_bypass_the_packed_kernel(dtype, packed_calls):
    """The packed kernel has no backward: where a gradient is recorded, ops.linear takes
    the ordinary product, so autograd stays right."""
    model = GPT(preset("tiny"), seed=0, dtype=dtype)
    packed = prepacked.for_model(model)
    assert packed is not None
    w = model.blocks[0].ffn.w_1
    x = torch.randn(2, model.config.d_model).to(model.wte.dtype).requires_grad_()
    ops.linear(x, packed.operand(w)).float().sum().backward()
    assert packed_calls == []
    want = w.detach().float().sum(dim=1)  # d(Σ xW)/dx = row sums of W
    assert torch.allclose(x.grad.float(), want.expand(2, -1), rtol=2 * B.Precision.of(dtype).u)


def test_only_16_bit_cpu_weights_are_packed():
    # (which 16-bit dtypes oneDNN packs depends on the CPU: PACKABLE, and
    # test_unpackable_dtypes_generate_unpacked for the others)
    assert prepacked.for_model(_model("float32")) is None
    assert prepacked.for_model(_model("float64")) is None
    assert not prepacked.supported("meta", torch.bfloat16)
    assert not prepacked.supported("cpu", torch.float32)


@pytest.mark.parametrize("dtype", PACKABLE)
def test_untied_unembedding_packs_its_own_matrix_not_the_embedding(dtype):
    model = _model(dtype, "tiny-guide")
    assert not model.config.tied_embeddings
    packed = prepacked.for_model(model)
    assert packed is not None
    assert id(model.wte) not in packed.table and id(model.w_u) in packed.table
    assert packed.table[id(model.w_u)].transposed
    assert np.array_equal(
        sorted(packed.table), sorted(id(p) for n, p in model.named_parameters()
                                     if p.ndim == 2 and n not in ("wte", "wpe")))


def test_a_model_made_under_inference_mode_generates_unpacked():
    """Its parameters have no version counter, so a packed copy could go stale unseen:
    nothing is packed, and generation still runs."""
    with torch.inference_mode():
        model = _model("bfloat16")
    assert prepacked.for_model(model) is None
    assert generate(model, [[1, 2, 3]], 4, GREEDY) == generate(_model("bfloat16"), [[1, 2, 3]],
                                                               4, GREEDY, prepack=False)


@pytest.mark.parametrize("dtype", sorted(set(HALF) - set(PACKABLE)) or ["none"])
def test_unpackable_dtypes_generate_unpacked(dtype, packed_calls):
    """Where oneDNN cannot pack a 16-bit dtype here, nothing is packed and generation
    still runs (through the plain product); on CPUs that pack both, there is none."""
    if dtype == "none":
        assert PACKABLE == HALF
        return
    model = _model(dtype)
    assert prepacked.for_model(model) is None
    out = generate(model, [[1, 2, 3]], 4)
    assert packed_calls == [] and len(out[0]) == 4
