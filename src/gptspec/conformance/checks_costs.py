"""The size and cost formulas against what a backend measurably has and does.

A backend offers its measurements through optional operations:
``parameter_shapes(config)`` (the parameters it would hold), ``count_flops(config,
batch, T, backward=False)`` (a multiply-add of a matrix product counted as 2, attention
computed densely, the masked half included), ``kv_cache_nbytes(config, batch)`` (a
full-context cache) and ``saved_activation_bytes(config, batch, T)`` (what autograd
saves for the backward of a float32 forward, attention weights materialised). Counts
are integers, compared for equality, except the activation memory, which the spec
estimates under stated assumptions.
"""

from __future__ import annotations

from hypothesis import strategies as st

from gptspec.conformance.registry import check
from gptspec.conformance.strategies import configs
from gptspec.reference import costs as ref

PARAM_COMPONENTS = {
    "param_count_token_embedding": lambda n: n == "wte",
    "param_count_positional_embedding": lambda n: n == "wpe",
    "param_count_attention": lambda n: ".attn." in n,
    "param_count_ffn": lambda n: ".ffn." in n,
    "param_count_block_norms": lambda n: ".ln_1." in n or ".ln_2." in n,
    "param_count_final_norm": lambda n: n.startswith("ln_f."),
    "param_count_unembedding": lambda n: n in ("w_u", "b_u"),
}
EXACT = "exact: counts are integers"


def _size(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


@check("param_count.matches_backend", entries=(*PARAM_COMPONENTS, "param_count_block",
                                               "param_count_total"),
       ops=("parameter_shapes",), kind="property", area="costs", budget=EXACT)
def param_count(backend, ctx):
    """Parameter counts, component by component.

    For every configuration, the number of elements of the backend's parameters of each
    component (token and positional embeddings, each block's attention, FFN and
    LayerNorms, the final LayerNorm, the untied unembedding) equals the spec's count of
    that component; the per-block count times L, and the total, equal the sums.
    """
    @ctx.given(config=configs(max_layers=3, max_heads=4, max_d_head=8, max_ctx=32,
                              max_vocab=200))
    def _(config):
        shapes = ctx.op("parameter_shapes")(config)
        for entry, belongs in PARAM_COMPONENTS.items():
            got = sum(_size(s) for name, s in shapes.items() if belongs(name))
            want = getattr(ref, entry)(config)
            per_block = entry in ("param_count_attention", "param_count_ffn",
                                  "param_count_block_norms")
            want = want * config.n_layers if per_block else want
            ctx.require(got == want, f"{entry}: backend has {got} elements, spec says {want} "
                                     f"for {config}")
        blocks = sum(_size(s) for name, s in shapes.items() if name.startswith("blocks."))
        ctx.require(blocks == config.n_layers * ref.param_count_block(config),
                    f"blocks: {blocks} elements, spec says L × {ref.param_count_block(config)}")
        total = sum(_size(s) for s in shapes.values())
        ctx.require(total == ref.param_count_total(config),
                    f"total: {total} elements, spec says {ref.param_count_total(config)}")


@check("flops.matches_backend", entries=("matmul_weights_per_token", "forward_flops_per_token",
                                         "training_flops_per_token"),
       ops=("count_flops",), kind="property", area="costs", budget=EXACT)
def flops(backend, ctx):
    """FLOPs per token.

    For every configuration and batch B of full-context sequences (T = n_ctx), the
    FLOPs the backend performs in a forward pass equal
    B·T·forward_flops_per_token + B·2·L·T²·h·d_k: the spec counts attention over the
    causal window (on average half of the T × T products), while a dense kernel also
    computes the masked half. The projections alone are 2·B·T·matmul_weights_per_token.
    A forward and backward pass performs exactly training_flops_per_token/
    forward_flops_per_token = 3 times the forward's FLOPs.
    """
    @ctx.given(config=configs(max_layers=2, max_heads=3, max_d_head=6, max_ctx=12,
                              max_vocab=40), batch=st.integers(1, 3))
    def _(config, batch):
        T, L = config.n_ctx, config.n_layers
        a = config.n_heads * config.d_head  # the width of Q, K, V: d_model unless d_k is free
        forward = ctx.op("count_flops")(config, batch, T)
        want = batch * T * ref.forward_flops_per_token(config) + batch * 2 * L * T * T * a
        ctx.require(forward == want, f"forward: backend counts {forward} FLOPs, spec gives "
                                     f"{want} for B={batch}, {config}")
        dense_attention = batch * 4 * L * T * T * a
        projections = forward - dense_attention
        ctx.require(projections == 2 * batch * T * ref.matmul_weights_per_token(config),
                    f"projections: {projections} FLOPs, spec gives "
                    f"{2 * batch * T * ref.matmul_weights_per_token(config)}")
        both = ctx.op("count_flops")(config, batch, T, backward=True)
        ratio = ref.training_flops_per_token(config) // ref.forward_flops_per_token(config)
        ctx.require(both == ratio * forward,
                    f"forward + backward: {both} FLOPs, spec gives {ratio} × {forward}")


@check("kv_cache_bytes.matches_backend", entries=("kv_cache_bytes",), ops=("kv_cache_nbytes",),
       kind="property", area="costs", budget=EXACT)
def kv_cache(backend, ctx):
    """KV-cache bytes: a full-context cache for a batch of B sequences holds exactly
    kv_cache_bytes(config, B, bytes per element of the backend's dtype) bytes of keys and
    values."""
    itemsize = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}[ctx.precision.dtype]

    @ctx.given(config=configs(max_layers=3, max_heads=4, max_d_head=8, max_ctx=64),
               batch=st.integers(1, 4))
    def _(config, batch):
        got = ctx.op("kv_cache_nbytes")(config, batch)
        want = ref.kv_cache_bytes(config, batch=batch, bytes_per_element=itemsize)
        ctx.require(got == want, f"KV cache of B={batch}: {got} bytes, spec says {want}")


@check("activation_memory_bytes.estimates_backend", entries=("activation_memory_bytes",),
       ops=("saved_activation_bytes",), kind="property", area="costs",
       budget="an estimate: within a factor of two of the backend's saved bytes, either way")
def activation_memory(backend, ctx):
    """Activation memory is a faithful estimate.

    The spec counts the d_model-, d_ff-, T²- and V-wide tensors a training step keeps
    (no recomputation, attention weights materialised); a backend also keeps small
    per-row statistics (LayerNorm's mean and inverse deviation) and may keep a tensor
    less. For every configuration and (B, T), the bytes autograd saves for a float32
    forward lie within a factor of two of activation_memory_bytes(config, B, T, 4), either
    way: a formula that forgot a block's tensors, or counted one twice, falls outside.
    """
    @ctx.given(config=configs(max_layers=2, max_heads=3, max_d_head=6, max_ctx=12,
                              max_vocab=40), batch=st.integers(1, 3), data=st.data())
    def _(config, batch, data):
        T = data.draw(st.integers(1, config.n_ctx), label="T")
        got = ctx.op("saved_activation_bytes")(config, batch, T)
        estimate = ref.activation_memory_bytes(config, batch=batch, seq_len=T,
                                               bytes_per_element=4)
        ctx.require(estimate <= 2 * got and got <= 2 * estimate,
                    f"B={batch}, T={T}: backend saves {got} bytes, the spec estimates "
                    f"{estimate} for {config}")
