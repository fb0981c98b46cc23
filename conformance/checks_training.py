"""Training checks: gradients by parameter name, AdamW trajectories, the loss, determinism
and exact resumption. A backend exposes them through the optional operations
``gpt_backward(tokens, targets, params, config) -> (loss, grads)``,
``adamw_trajectory(params, grads, lrs, beta1, beta2, eps, weight_decay) -> [params, …]``
and ``train_losses(config, params, tokens, steps, seed, resume_at=None) -> [loss, …]``.

Budgets (λ = budgets.LAMBDA, u the backend's unit roundoff, u_acc its accumulation's):

* a gradient passes through D sequential stages (D = 12 per block + 6: embedding, the
  block's LayerNorms, matrix products, softmax, activation and residual sums in both
  directions, the loss), each a reduction of length at most n = max(B·T, V, d_ff, d)
  whose relative rounding error has scale √n·u_acc (Higham & Mary 2019), and whose result
  is stored once in the backend's dtype (u); independent stages add in quadrature, so a
  gradient tensor g is within λ·(√(D·n)·u_acc + √D·u)·max|g| of the exact one, entry by
  entry, max|g| the largest gradient entry of the whole model —
  errors reach every entry through the upstream gradients ∂L/∂H, whose scale that is,
  and a LayerNorm's backward can cancel a gradient to far below its rounding error
  (e.g. over d_model = 2 features, where x̂ = ±1 whatever x is), so an entry's own size
  is no measure of its error;
* the loss is a mean of −log p over N positions: an error e in the logits moves it by at
  most 2 max e (|∂L/∂z| sums to at most 2 per row, divided by N), plus the rounding of
  its own length-N·V reductions;
* AdamW's update m̂/(√v̂ + ε) is computed with about 10 roundings per element per step
  (the two moment updates, the two bias corrections, the square root, the division, the
  decay and the subtraction); over k steps they add in quadrature.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from gptspec import reference as ref
from gptspec.conformance import budgets as B
from gptspec.conformance.registry import check
from gptspec.conformance.strategies import model_cases

GRADIENT_ENTRIES = ("cross_entropy_gradient", "linear_backward", "token_embedding_backward",
                    "positional_embedding_backward", "input_representation_backward",
                    "tied_embedding_accumulation", "unembed_tied_backward",
                    "unembed_untied_backward", "layer_norm_backward", "softmax_backward",
                    "scaled_dot_product_attention_backward", "multi_head_attention_backward",
                    "relu_backward", "gelu_backward", "gelu_tanh_backward", "ffn_relu_backward",
                    "ffn_gelu_backward", "ffn_gelu_tanh_backward", "ffn_guide_product_backward",
                    "residual_backward", "block_pre_ln_backward", "block_post_ln_backward",
                    "block_guide_backward", "gpt_backward")
STAGES_PER_BLOCK, STAGES_OUTSIDE = 12, 6
ADAMW_ROUNDINGS = 10


def largest_gradient(grads: dict) -> float:
    return max(float(np.max(np.abs(g))) for g in grads.values())


def gradient_scale(largest: float, config, tokens: np.ndarray, p: B.Precision) -> float:
    """(√(D·n)·u_acc + √D·u)·max|g|, max|g| the model's largest gradient entry: the error
    scale of every gradient entry (see the module doc); √D·u is each stage's result
    stored once in the backend's dtype (it matters for 16-bit dtypes)."""
    D = STAGES_PER_BLOCK * config.n_layers + STAGES_OUTSIDE
    n = max(tokens.size, config.vocab_size, config.d_ff, config.d_model)
    return (math.sqrt(D * n) * p.u_acc + math.sqrt(D) * p.u) * largest + p.tiny


def _case(case, dtype: str, data):
    config, recipe, tokens = case
    params = {k: B.round_to(v, dtype) for k, v in recipe.make().items()}
    targets = np.asarray(data.draw(st.lists(st.integers(0, config.vocab_size - 1),
                                            min_size=tokens.size, max_size=tokens.size),
                                   label="targets")).reshape(tokens.shape)
    return config, params, tokens, targets


@check("gpt_backward.differential", entries=GRADIENT_ENTRIES, ops=("gpt_backward",),
       depends_on=("gpt_forward.differential",), area="training",
       budget="λ·(√(D·n)·u_acc + √D·u)·max|g| (D stages, reductions of length n, the "
              "largest gradient)")
def gradients(backend, ctx):
    """Every gradient against the reference's hand-written backward pass, by parameter
    name: the backend's ∂L/∂θ of the mean cross-entropy equals ``gpt_backward``'s for
    every parameter of the schema, over configurations of every variant.

    Precondition: d_model ≥ 2. Over a single feature LayerNorm's output is exactly β
    (x − μ = 0), so the exact gradient of its gain is 0 while a backend's is rounding
    noise amplified by 1/√ε — a property of the model, not of the backend."""
    @ctx.given(case=model_cases(ctx.precision.dtype).filter(lambda c: c[0].d_model >= 2),
               data=st.data())
    def _(case, data):
        config, params, tokens, targets = _case(case, ctx.precision.dtype, data)
        _, expected = ref.gpt_backward(tokens, targets, params, config)
        _, grads = ctx.op("gpt_backward")(tokens, targets, params, config)
        ctx.require(set(grads) == set(expected),
                    f"gradients named {sorted(set(grads) ^ set(expected))} do not match the "
                    "schema")
        scale = gradient_scale(largest_gradient(expected), config, tokens, ctx.precision)
        for name, g in expected.items():
            ctx.record(name, B.compare(grads[name], g, B.budget(scale)))


@check("cross_entropy_mean.differential", entries=("cross_entropy_mean", "cross_entropy_sum",
                                                  "log_softmax"),
       ops=("gpt_backward",), depends_on=("gpt_forward.differential",), area="training",
       budget="2·max(logit error) + √(N·V)·u_acc·|L|")
def loss(backend, ctx):
    """The loss equals −log of the reference's probabilities: the backend's mean
    cross-entropy equals −(1/N) Σ_t log P_ref(y_t | x_≤t), with P_ref the reference's
    ``next_token_distribution`` of its logits; N times it is the Blueprint's eq 10 sum
    −Σ_t log P_ref(y_t | x_≤t), within N times the budget."""
    @ctx.given(case=model_cases(ctx.precision.dtype), data=st.data())
    def _(case, data):
        config, params, tokens, targets = _case(case, ctx.precision.dtype, data)
        probs = ref.next_token_distribution(ref.gpt_forward(tokens, params, config))
        expected = -np.mean(np.log(np.take_along_axis(probs, targets[..., None], -1)))
        got, _ = ctx.op("gpt_backward")(tokens, targets, params, config)
        logit_error = float(np.max(B.gpt_forward_bound(tokens, params, config, ctx.precision)))
        scale = 2 * logit_error + ctx.precision.sum_scale(probs.size) * abs(expected)
        ctx.record("loss", B.compare(np.float64(got), expected, B.budget(scale)))
        N = targets.size
        picked = np.take_along_axis(probs, targets[..., None], -1)
        total = -np.sum(np.log(picked))
        ctx.record("N · loss vs the eq 10 sum",
                   B.compare(N * np.float64(got), total, N * B.budget(scale)))


@check("adamw_step.trajectory", entries=("adamw_step", "lr_schedule"),
       ops=("adamw_trajectory",), area="training",
       budget="√(10·k)·u·(|θ_k| + Σ_t η_t(|update_t| + λ|θ_t|)) after k steps")
def adamw(backend, ctx):
    """N AdamW steps against the reference's trajectory: fed the same gradients at the
    schedule's learning rates, the backend's parameters after each step equal
    ``adamw_step``'s, with decoupled weight decay and bias correction."""
    p = ctx.precision

    @ctx.given(n=st.integers(1, 8), steps=st.integers(1, 6), seed=st.integers(0, 2**16),
               weight_decay=st.sampled_from([0.0, 0.1]))
    def _(n, steps, seed, weight_decay):
        rng = np.random.default_rng(seed)
        theta = {"w": B.round_to(rng.normal(size=(n, 3)), p.dtype)}
        grads = [{"w": B.round_to(rng.normal(size=(n, 3)), p.dtype)} for _ in range(steps)]
        lrs = [ref.lr_schedule(t, 1e-2, 1e-3, 2, steps + 2) for t in range(steps)]
        beta1, beta2, eps = 0.9, 0.95, 1e-8
        got = ctx.op("adamw_trajectory")(theta, grads, lrs, beta1, beta2, eps, weight_decay)
        th, m, v = theta["w"], np.zeros((n, 3)), np.zeros((n, 3))
        moved = np.zeros((n, 3))
        for t in range(steps):
            before = th
            th, m, v = ref.adamw_step(th, grads[t]["w"], m, v, t + 1, lrs[t], beta1, beta2,
                                      eps, weight_decay)
            moved = moved + np.abs(th - before) + lrs[t] * weight_decay * np.abs(before)
            scale = math.sqrt(ADAMW_ROUNDINGS * (t + 1)) * p.u * (np.abs(th) + moved) + p.tiny
            ctx.record(f"θ after step {t + 1}", B.compare(got[t]["w"], th, B.budget(scale)))


@check("training.determinism", entries=("adamw_step", "cross_entropy_mean"),
       ops=("train_losses",), kind="property", area="training",
       budget="exact: bit-identical losses")
def determinism(backend, ctx):
    """Determinism: two runs of the same training (same seed, data and parameters) give
    bit-identical losses at every step."""
    @ctx.given(case=model_cases(ctx.precision.dtype, max_layers=1), seed=st.integers(0, 99))
    def _(case, seed):
        config, recipe, _ = case
        tokens = np.random.default_rng(seed).integers(0, config.vocab_size, 4 * config.n_ctx + 8)
        params = recipe.make()
        a = ctx.op("train_losses")(config, params, tokens, 3, seed)
        b = ctx.op("train_losses")(config, params, tokens, 3, seed)
        ctx.require(a == b, f"losses differ between identical runs: {a} vs {b}")


@check("training.resume", entries=("adamw_step",), ops=("train_losses",), kind="property",
       depends_on=("training.determinism",), area="training",
       budget="exact: bit-identical losses")
def resume(backend, ctx):
    """Resuming is exact: a run checkpointed after k steps and resumed from the checkpoint
    gives bit-identically the losses of the uninterrupted run."""
    @ctx.given(case=model_cases(ctx.precision.dtype, max_layers=1), seed=st.integers(0, 99),
               k=st.integers(1, 2))
    def _(case, seed, k):
        config, recipe, _ = case
        tokens = np.random.default_rng(seed).integers(0, config.vocab_size, 4 * config.n_ctx + 8)
        params = recipe.make()
        whole = ctx.op("train_losses")(config, params, tokens, 3, seed)
        resumed = ctx.op("train_losses")(config, params, tokens, 3, seed, resume_at=k)
        ctx.require(whole == resumed, f"resumed at step {k}: {resumed}, uninterrupted: {whole}")


@check("clip_grad_norm.differential", entries=("clip_grad_norm",), ops=("clip_grad_norm",),
       area="training",
       budget="λ·|g'|·(√N·u_acc + 3u) for each clipped entry; λ·(√N·u_acc + u)·‖g‖")
def clip(backend, ctx):
    """Gradient-norm clipping over all parameters together: the backend's global norm
    ‖g‖ = √(Σ_p Σ_i g_{p,i}²) and its clipped gradients g·min(1, c/(‖g‖ + 10⁻⁶)) equal the
    reference's, both when ‖g‖ exceeds c and when it does not. The norm is a length-N sum
    (N entries in all); the scale inherits its relative error, and each clipped entry is
    one more product."""
    p = ctx.precision

    @ctx.given(shapes=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1,
                               max_size=4),
               seed=st.integers(0, 2**16), ratio=st.sampled_from([0.1, 0.5, 0.99, 1.5, 10.0]))
    def _(shapes, seed, ratio):
        rng = np.random.default_rng(seed)
        grads = {f"p{i}": B.round_to(rng.normal(size=s), p.dtype) for i, s in enumerate(shapes)}
        norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
        max_norm = float(B.round_to(ratio * norm, p.dtype))
        expected, expected_norm = ref.clip_grad_norm(grads, max_norm)
        got, got_norm = ctx.op("clip_grad_norm")(grads, max_norm)
        N = sum(g.size for g in grads.values())
        ctx.record("‖g‖", B.compare(np.float64(got_norm), expected_norm,
                                    B.budget((p.sum_scale(N) + p.u) * expected_norm + p.tiny)))
        for name, g in expected.items():
            scale = np.abs(g) * (p.sum_scale(N) + 3 * p.u) + p.tiny
            ctx.record(f"clipped {name}", B.compare(got[name], g, B.budget(scale)))
