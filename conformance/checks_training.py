"""Training checks: gradients by parameter name, AdamW trajectories, the loss, determinism
and exact resumption. A backend exposes them through the optional operations
``gpt_backward(tokens, targets, params, config) -> (loss, grads)``,
``adamw_trajectory(params, grads, lrs, beta1, beta2, eps, weight_decay) -> [params, …]``
and ``train_losses(config, params, tokens, steps, seed, resume_at=None) -> [loss, …]``.

Budgets (λ = budgets.LAMBDA, u the backend's unit roundoff, u_acc its accumulation's):

* a gradient's error is propagated through the reference's backward pass stage by stage
  (gradient_budgets.gpt_backward_bound, which mirrors gpt_backward): at each backward
  equation the upstream gradient's error and the forward activations' errors are
  carried through the equation to first order, each reduction of length n adds
  √n·u_acc·Σ|terms| and each stored result u·|g|, independent contributions in
  quadrature. This sees what one scale for the whole model cannot: a LayerNorm's
  backward amplifies the errors reaching it by |γ|/s, s = √(σ² + ε), which is large
  for a row of nearly equal features, and the amplification compounds through the
  layers below;
* the loss is a mean of −log p over N positions: an error e in the logits moves it by at
  most 2 max e (|∂L/∂z| sums to at most 2 per row, divided by N; log-softmax is
  2-Lipschitz in the largest entry, so this holds for errors of any size, p → 0
  included), plus the rounding of its own length-N·V reductions and of the stored loss
  (u·|L|: a 16-bit backend may return it in its dtype);
* AdamW's update m̂/(√v̂ + ε) is computed with about 10 roundings per element per step
  (the two moment updates, the two bias corrections, the square root, the division, the
  decay and the subtraction); over k steps they add in quadrature. They are float32
  roundings (u_acc) in every dtype: a 16-bit backend keeps m, v and the update in
  float32 and stores the parameter in its dtype (the spec's decision on adamw_step), so
  it adds one rounding u·|θ_t| per step, carried unchanged (to first order) to the end.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from gptspec import reference as ref
from gptspec.conformance import budgets as B
from gptspec.conformance.gradient_budgets import gpt_backward_bound
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
ADAMW_ROUNDINGS = 10


def _case(case, dtype: str, data):
    config, recipe, tokens = case
    params = {k: B.round_to(v, dtype) for k, v in recipe.make().items()}
    targets = np.asarray(data.draw(st.lists(st.integers(0, config.vocab_size - 1),
                                            min_size=tokens.size, max_size=tokens.size),
                                   label="targets")).reshape(tokens.shape)
    return config, params, tokens, targets


@check("gpt_backward.differential", entries=GRADIENT_ENTRIES, ops=("gpt_backward",),
       depends_on=("gpt_forward.differential",), area="training",
       budget="λ × the error scale propagated through the reference's backward pass stage "
              "by stage (gradient_budgets.gpt_backward_bound)")
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
        scales = gpt_backward_bound(tokens, targets, params, config, ctx.precision)
        for name, g in expected.items():
            ctx.record(name, B.compare(grads[name], g, B.budget(scales[name][1])))


@check("cross_entropy_mean.differential", entries=("cross_entropy_mean", "cross_entropy_sum",
                                                  "log_softmax"),
       ops=("gpt_backward",), depends_on=("gpt_forward.differential",), area="training",
       budget="(2·max(logit error) + √(N·V)·u_acc·|L|) ⊕ u·|L|")
def loss(backend, ctx):
    """The loss equals −log of the reference's probabilities: the backend's mean
    cross-entropy equals −(1/N) Σ_t log P_ref(y_t | x_≤t), with P_ref the reference's
    ``next_token_distribution`` of its logits; N times it is the Blueprint's eq 10 sum
    −Σ_t log P_ref(y_t | x_≤t), within N times the budget. log P_ref is taken as the
    reference's ``log_softmax`` (the same number), since log of a probability that
    underflows to 0 (a logit gap past 745) would be −∞ where a correct loss is finite."""
    @ctx.given(case=model_cases(ctx.precision.dtype), data=st.data())
    def _(case, data):
        config, params, tokens, targets = _case(case, ctx.precision.dtype, data)
        log_probs = ref.log_softmax(ref.gpt_forward(tokens, params, config))
        picked = np.take_along_axis(log_probs, targets[..., None], -1)
        expected = -np.mean(picked)
        got, _ = ctx.op("gpt_backward")(tokens, targets, params, config)
        logit_error = float(np.max(B.gpt_forward_bound(tokens, params, config, ctx.precision)))
        # the loss may be returned in the dtype: one more rounding, u·|L|
        scale = np.hypot(2 * logit_error + ctx.precision.sum_scale(log_probs.size) * abs(expected),
                         ctx.precision.store(expected))
        ctx.record("loss", B.compare(np.float64(got), expected, B.budget(scale)))
        N = targets.size
        ctx.record("N · loss vs the eq 10 sum",
                   B.compare(N * np.float64(got), -np.sum(picked), N * B.budget(scale)))


@check("adamw_step.trajectory", entries=("adamw_step", "lr_schedule"),
       ops=("adamw_trajectory",), area="training",
       budget="λ·(√(10·k)·u_acc·(|θ_k| + Σ_t η_t(|update_t| + λ|θ_t|)) ⊕ u·√(Σ_t θ_t²)) "
              "after k steps (the second term in 16 bit only)")
def adamw(backend, ctx):
    """N AdamW steps against the reference's trajectory: fed the same gradients at the
    schedule's learning rates, the backend's parameters after each step equal
    ``adamw_step``'s, with decoupled weight decay and bias correction. In 16 bit the
    step is the spec's (float32 state and update, the parameter stored in the dtype):
    a backend whose state or update is 16-bit fails it. Small gradients (10⁻⁵: g² is 0
    in float16) and small parameters (10⁻³: the update's own error is then larger than
    the parameter's storage) are drawn, where 16-bit state shows."""
    p = ctx.precision

    @ctx.given(n=st.integers(1, 8), steps=st.integers(1, 6), seed=st.integers(0, 2**16),
               weight_decay=st.sampled_from([0.0, 0.1]),
               theta_scale=st.sampled_from([1.0, 1e-3]), grad_scale=st.sampled_from([1.0, 1e-5]))
    def _(n, steps, seed, weight_decay, theta_scale, grad_scale):
        rng = np.random.default_rng(seed)
        theta = {"w": B.round_to(theta_scale * rng.normal(size=(n, 3)), p.dtype)}
        grads = [{"w": B.round_to(grad_scale * rng.normal(size=(n, 3)), p.dtype)}
                 for _ in range(steps)]
        lrs = [ref.lr_schedule(t, 1e-2, 1e-3, 2, steps + 2) for t in range(steps)]
        beta1, beta2, eps = 0.9, 0.95, 1e-8
        got = ctx.op("adamw_trajectory")(theta, grads, lrs, beta1, beta2, eps, weight_decay)
        th, m, v = theta["w"], np.zeros((n, 3)), np.zeros((n, 3))
        moved, stored = np.zeros((n, 3)), np.zeros((n, 3))
        for t in range(steps):
            before = th
            th, m, v = ref.adamw_step(th, grads[t]["w"], m, v, t + 1, lrs[t], beta1, beta2,
                                      eps, weight_decay)
            moved = moved + np.abs(th - before) + lrs[t] * weight_decay * np.abs(before)
            if p.u > p.u_acc:  # 16 bit: the float32 θ_t stored in the dtype
                stored = np.hypot(stored, p.u * np.abs(th) + p.tiny)
            update = math.sqrt(ADAMW_ROUNDINGS * (t + 1)) * p.u_acc * (np.abs(th) + moved)
            scale = np.hypot(update, stored) + p.tiny
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
