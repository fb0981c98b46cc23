"""Checks of the optimizer group (spec/optimizer.py, reference/optimizer.py): AdamW
trajectories, the learning-rate schedule, gradient clipping, determinism, exact
resumption and the trainer's own loop, through the optional operations
``adamw_trajectory``, ``lr_schedule``, ``clip_grad_norm``, ``train_losses`` and
``train_loop``. AdamW's update adds about 10 float32 roundings per element per step, in
quadrature over steps; a 16-bit backend adds one rounding u·|θ_t| per step for storing
the parameter in its dtype.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from gptspec import reference as ref
from gptspec.conformance import budgets as B
from gptspec.conformance.context import NotImplementedOp
from gptspec.conformance.gradient_budgets import gpt_backward_bound
from gptspec.conformance.registry import check
from gptspec.conformance.strategies import model_cases
from gptspec.spec import GPTConfig, init_parameters

ADAMW_ROUNDINGS = 10


@check("adamw_step.trajectory", entries=("adamw_step", "lr_schedule"),
       ops=("adamw_trajectory",), area="training",
       budget="λ·(√(10·k)·u_acc·(|θ_k| + Σ_t η_t(|update_t| + λ_wd|θ_t|)) ⊕ u·√(Σ_t θ_t²)) "
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


@check("lr_schedule.differential", entries=("lr_schedule",), ops=("lr_schedule",),
       area="training", budget="λ·√8·u·η_max (the schedule's roundings)")
def lr_schedule_differential(backend, ctx):
    """The backend's schedule on its own: ``lr_schedule(step, max_lr, min_lr, warmup_steps,
    decay_steps)`` equals the reference's η(s) — the linear warm-up η_max (s + 1)/W for
    s < W, the cosine from η_max to η_min until S, η_min from S on — for steps 0 … 50
    around both edges, W of 0 … 8 (none, one step, several), S before, at and after W, and
    rates that are not exact in binary. Budget: the eight roundings of the formula in the
    dtype (as lr_schedule.in_the_loop)."""
    p = ctx.precision

    @ctx.given(max_lr=st.floats(1e-5, 1.0), floor=st.sampled_from([0.0, 0.1, 0.37]),
               warmup=st.integers(0, 8), decay=st.integers(0, 40), step=st.integers(0, 50))
    def _(max_lr, floor, warmup, decay, step):
        min_lr = floor * max_lr
        expected = ref.lr_schedule(step, max_lr, min_lr, warmup, decay)
        got = ctx.op("lr_schedule")(step, max_lr, min_lr, warmup, decay)
        scale = math.sqrt(LR_ROUNDINGS) * p.u * max_lr + p.tiny
        ctx.record(f"η at step {step} (W = {warmup}, S = {decay})",
                   B.compare(np.float64(got), expected, B.budget(scale)))


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
        a = ctx.op("train_losses")(tokens, params, config, 3, seed)
        b = ctx.op("train_losses")(tokens, params, config, 3, seed)
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
        whole = ctx.op("train_losses")(tokens, params, config, 3, seed)
        resumed = ctx.op("train_losses")(tokens, params, config, 3, seed, resume_at=k)
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


LR_ROUNDINGS = 8  # (s − W)/(S − W), ·π, cos, 1 +, ·(η_max − η_min) and its difference, ·½, + η_min


MOMENT_ROUNDINGS = 3  # β·m, (1 − β)·g (or g·g, then ·(1 − β)), the sum


def _adam_update_box(m_hat, v_hat, dm_hat, dv_hat, eps: float, cap: float) -> np.ndarray:
    """The largest change of AdamW's direction m̂/(√v̂ + ε) over the box m̂ ± δm̂,
    v̂ ± δv̂ (v̂ kept ≥ 0). For a fixed v̂ the direction is linear in m̂, for a fixed m̂
    monotone in v̂, so the extremes lie at the box's corners. ``cap`` bounds |m̂|/√v̂
    for any gradient history (Cauchy–Schwarz), so no direction differs from the
    reference's by more than |its own| + cap."""
    u = m_hat / (np.sqrt(v_hat) + eps)
    worst = np.zeros_like(u)
    for m in (m_hat - dm_hat, m_hat + dm_hat):
        for v in (np.maximum(v_hat - dv_hat, 0.0), v_hat + dv_hat):
            worst = np.maximum(worst, np.abs(m / (np.sqrt(v) + eps) - u))
    return np.minimum(worst, np.abs(u) + cap)


def adam_direction_cap(t: int, beta1: float, beta2: float) -> float:
    """C_t ≥ |m̂_t| / √v̂_t for every gradient sequence: by Cauchy–Schwarz,
    |Σ_i (1−β₁)β₁^{t−i} g_i| ≤ (1−β₁)·√(Σ_i β₁^{2(t−i)}/((1−β₂)β₂^{t−i}))·√v_t, and the bias
    corrections scale it by √(1−β₂ᵗ)/(1−β₁ᵗ). (C_1 = 1: the first step moves by ±η.)"""
    r = sum((beta1**2 / beta2) ** k for k in range(t))
    return (1 - beta1) * math.sqrt(r / (1 - beta2)) * math.sqrt(1 - beta2**t) / (1 - beta1**t)


def moment_errors(dm, dv, m, v, g, dg, beta1: float, beta2: float, p: B.Precision):
    """(δm_t, δv_t): the moments' errors after a step whose gradient g errs by δg, from
    δm_{t−1}, δv_{t−1} (m, v: the reference's moments after the step)."""
    dm = beta1 * dm + (1 - beta1) * dg + B.LAMBDA * MOMENT_ROUNDINGS * p.u * np.abs(m)
    dv = (beta2 * dv + (1 - beta2) * (2 * np.abs(g) * dg + dg**2)
          + B.LAMBDA * MOMENT_ROUNDINGS * p.u * v)
    return dm, dv


def adamw_entry_bound(m, v, dm, dv, t: int, settings, cap: float, before, theta, lr: float,
                      decay: float, p: B.Precision) -> np.ndarray:
    """The bound on |θ_backend − θ_t| after AdamW's step t, entry by entry, from the
    reference's moments m, v (errors dm, dv), θ_{t−1} ``before`` (the backend's) and θ_t
    ``theta``. The direction may change by D, the largest change of m̂/(√v̂ + ε) over the
    moments' box, so the step by η·D: a supremum a correct backend attains where the box
    holds both signs of the gradient (an entry whose reference gradient is 0 but not the
    backend's: its direction ±(1 − ε/|g|) at the first step, D = the cap, 1). The update's
    own roundings, λ·√10·u, come on top, relative to the backend's update (up to
    |m̂/(√v̂ + ε)| + D) and θ_t (up to |θ_t| + η·D), not the reference's: at θ = 0 a
    flip with |g| ≫ ε/u rounds to η(1 + 3u), past η·1 plus roundings of 0."""
    b1, b2 = settings.beta1, settings.beta2
    m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
    direction = m_hat / (np.sqrt(v_hat) + settings.eps)
    box = _adam_update_box(m_hat, v_hat, dm / (1 - b1**t), dv / (1 - b2**t), settings.eps, cap)
    rounding = math.sqrt(ADAMW_ROUNDINGS) * p.u * (
        np.abs(theta) + lr * (np.abs(direction) + 2 * box + decay * np.abs(before))) + p.tiny
    return lr * box + B.budget(rounding)


@st.composite
def loop_settings(draw, steps: tuple[int, int] = (2, 6)) -> dict:
    """Settings of a short run: warm-up off or on, a cosine horizon before, at or after the
    last step, accumulation 1–3, weight decay 0 or 0.1, clipping off or at a fraction of
    the first step's gradient norm (``clip_ratio``, resolved by the check)."""
    n = draw(st.integers(*steps), label="steps")
    return dict(max_steps=n, batch_size=draw(st.integers(1, 2), label="batch_size"),
                grad_accum=draw(st.integers(1, 3), label="grad_accum"),
                lr=draw(st.sampled_from([1e-2, 3e-3]), label="lr"),
                warmup_steps=draw(st.sampled_from([0, 1, 3]), label="warmup_steps"),
                decay_steps=draw(st.sampled_from([0, max(n - 1, 1), n + 3]), label="decay_steps"),
                beta2=draw(st.sampled_from([0.99, 0.95]), label="beta2"),
                weight_decay=draw(st.sampled_from([0.0, 0.1]), label="weight_decay"),
                seed=draw(st.integers(0, 2**16), label="seed"),
                clip_ratio=draw(st.sampled_from([0.0, 0.3, 0.8, 3.0]), label="clip_ratio"))


def _loop_case(case, drawn: dict, dtype: str):
    """The configuration, parameters (rounded to the dtype), a token stream and the
    settings, with the clipping norm c = clip_ratio·‖g‖ of the first step's gradient."""
    config, recipe, _ = case
    params = {k: B.round_to(v, dtype) for k, v in recipe.make().items()}
    drawn = dict(drawn)
    ratio = drawn.pop("clip_ratio")
    tokens = np.random.default_rng(drawn["seed"]).integers(0, config.vocab_size,
                                                           4 * config.n_ctx + 8)
    settings = ref.training.TrainLoopSettings(**drawn, min_lr=drawn["lr"] / 10, grad_clip=0.0)
    if ratio:
        first = ref.training.train_step(params, None, 0, ref.training.training_batches(
            tokens, 0, settings, config.n_ctx), config, settings)
        settings = ref.training.TrainLoopSettings(**{**settings.as_dict(),
                                                     "grad_clip": ratio * first.norm})
    return config, params, tokens, settings


def _require_run_shape(ctx, run, steps: int, names: set) -> None:
    ctx.require(isinstance(run, tuple) and len(run) == 3,
                "train_loop must return (losses, lrs, params after each step)")
    losses, lrs, trajectory = run
    ctx.require(len(losses) == len(lrs) == len(trajectory) == steps,
                f"{steps} steps asked, got {len(losses)} losses, {len(lrs)} learning-rate "
                f"records and {len(trajectory)} parameter sets")
    for t in range(steps):
        ctx.require(set(trajectory[t]) == names and set(lrs[t]) == names,
                    f"step {t + 1}: parameters named "
                    f"{sorted(names ^ set(trajectory[t]) | names ^ set(lrs[t]))} do not "
                    "match the schema")


# The smallest model (the schedule does not depend on it): the check is about the steps.
SCHEDULE_CONFIG = GPTConfig(vocab_size=5, n_ctx=3, d_model=2, n_layers=1, n_heads=1, d_ff=2)


@check("lr_schedule.in_the_loop", entries=("lr_schedule", "train_loop"), ops=("train_loop",),
       area="training", budget="λ·√8·u·η_max (the schedule's roundings)")
def lr_in_the_loop(backend, ctx):
    """The learning rate the backend's own loop steps each parameter with, step by step,
    equals ``lr_schedule`` under the loop's horizon rule (``train_loop``'s Decision):
    S' = decay_steps or the number of steps, W' = min(W, S'), S'' = max(S', W + 1).
    Runs of 4 to 12 steps, so the warm-up, the cosine and the floor η_min all occur.
    Float32 and float64 only, as train_loop.matches_reference (16-bit training is autocast
    over float32 parameters, whose loop the float32 run checks)."""
    p = ctx.precision
    if p.u > B.UNIT_ROUNDOFF["float32"]:
        raise NotImplementedOp("train_loop in 16-bit (the check runs in float32 and float64: "
                               "16-bit training is autocast over float32 parameters)")

    @ctx.given(drawn=loop_settings(steps=(4, 12)))
    def _(drawn):
        config = SCHEDULE_CONFIG
        params = {k: B.round_to(v, p.dtype)
                  for k, v in init_parameters(config, drawn["seed"]).items()}
        tokens = np.random.default_rng(drawn["seed"]).integers(0, config.vocab_size, 20)
        kept = {k: v for k, v in drawn.items() if k != "clip_ratio"}
        settings = ref.training.TrainLoopSettings(**{**kept, "batch_size": 1, "grad_accum": 1},
                                                  min_lr=drawn["lr"] / 10, grad_clip=0.0)
        run = ctx.op("train_loop")(tokens, params, config, settings)
        _require_run_shape(ctx, run, settings.max_steps, set(params))
        scale = math.sqrt(LR_ROUNDINGS) * p.u * settings.lr + p.tiny
        for t, used in enumerate(run[1]):
            eta = ref.training.scheduled_lr(t, settings)
            for name, lr in used.items():
                ctx.record(f"η of {name} at step {t + 1}",
                           B.compare(np.float64(lr), eta, B.budget(scale)))


@check("train_loop.matches_reference", entries=("train_loop", "adamw_step", "clip_grad_norm"),
       ops=("train_loop",), area="training",
       depends_on=("gpt_backward.differential", "cross_entropy_mean.differential",
                   "lr_schedule.in_the_loop"),
       budget="per step at the backend's state: the loss λ·(the micro-batches' mean of "
              "2·max(logit error) + √(N·V)·u_acc·|L| + (√k·u_acc + u)·|L|); θ: η·D + "
              "λ·√10·u·(|θ| + η(|update| + 2D + λ_wd|θ|)), D the largest change of "
              "m̂/(√v̂+ε) over the moments' error box (a correct backend reaches η·D where "
              "the box leaves a gradient's sign open)")
def loop_matches_reference(backend, ctx):
    """The backend's own training loop takes the reference's steps: run for 2–6 steps from
    the same parameters on the same token stream, each step's loss and the parameters
    after it, by name, equal those of ``train_loop``'s step replayed at the state the
    backend reached (its parameters after the previous step; the reference's own AdamW
    moments). Settings are drawn: warm-up on or off, the cosine's horizon, accumulation of
    1–3 micro-batches, weight decay 0 or 0.1 (matrices only), clipping off or at a norm that
    clips (a fraction of the first gradient's norm).

    Budget, per step s and parameter entry (λ = budgets.LAMBDA; u the backend's unit
    roundoff): each micro-batch's gradient is within δg of ``gpt_backward``'s,
    δg = λ·gradient_budgets.gpt_backward_bound entry by entry (as in
    gpt_backward.differential); their mean adds its own sum's
    rounding. Clipping multiplies by σ = min(1, c/(‖g‖ + 10⁻⁶)), monotone in ‖g‖, and
    ‖g‖ is within ‖δg‖₂ plus its length-N sum's rounding, so σ lies between its values at
    the ends of that interval. The moments carry the step's error forward:
    δm_s = β₁δm_{s−1} + (1−β₁)δĝ + λ·3u|m|, δv_s = β₂δv_{s−1} + (1−β₂)(2|ĝ|δĝ + δĝ²) +
    λ·3u·v. AdamW's direction m̂/(√v̂ + ε) is then bounded over the box m̂ ± δm̂, v̂ ± δv̂
    at its corners: where v̂ is small 1/√v̂ amplifies the gradient's error, up to the
    largest direction any gradient history allows (C_s, by Cauchy–Schwarz; 1 at the first
    step). The parameter is within η_s times that, D, plus the update's own roundings
    (λ·√10·u·(|θ| + η_s(|update| + 2D) + η_sλ|θ|): the backend's update and θ may be
    larger than the reference's by D and η_s·D). Replaying at the backend's state means no
    error compounds through the model from one step to the next. η_s·D is attained, not
    exceeded: where the box holds both signs of a gradient, the backend steps by up to
    η_s·C_s either way (see adamw_entry_bound). Such entries are common: the reference's
    ∂b_k is 0 (softmax ignores a shift of a row's scores), as are ∂q and ∂k with one
    position, and the backend's is a rounding's noise, so a correct backend shows ~100%.

    Float32 and float64 only: a backend trains 16-bit models by autocast over float32
    parameters (with float16's loss scaling, which skips steps), not in the dtype itself."""
    p = ctx.precision
    if p.u > B.UNIT_ROUNDOFF["float32"]:
        raise NotImplementedOp("train_loop in 16-bit (the check runs in float32 and float64: "
                               "16-bit training is autocast over float32 parameters)")

    @ctx.given(case=model_cases(p.dtype, max_layers=1).filter(lambda c: c[0].d_model >= 2),
               drawn=loop_settings())
    def _(case, drawn):
        config, params, tokens, settings = _loop_case(case, drawn, p.dtype)
        run = ctx.op("train_loop")(tokens, params, config, settings)
        _require_run_shape(ctx, run, settings.max_steps, set(params))
        losses, _, trajectory = run
        b1, b2 = settings.beta1, settings.beta2
        theta, moments = params, None
        dm = {k: np.zeros_like(v) for k, v in params.items()}
        dv = {k: np.zeros_like(v) for k, v in params.items()}
        for s in range(settings.max_steps):
            batches = ref.training.training_batches(tokens, s, settings, config.n_ctx)
            trace = ref.training.train_step(theta, moments, s, batches, config, settings)
            ctx.record(f"loss at step {s + 1}",
                       B.compare(np.float64(losses[s]), trace.loss,
                                 B.budget(_loss_scale(trace, batches, theta, config, p))))
            dg = _clipped_gradient_bound(trace, batches, theta, config, settings, p)
            t = s + 1
            cap = adam_direction_cap(t, b1, b2)
            for name, got in trajectory[s].items():
                m, v = trace.m[name], trace.v[name]
                dm[name], dv[name] = moment_errors(dm[name], dv[name], m, v,
                                                   trace.clipped[name], dg[name], b1, b2, p)
                before = np.asarray(theta[name])
                decay = settings.weight_decay if ref.training.decays(before.shape) else 0.0
                bound = adamw_entry_bound(m, v, dm[name], dv[name], t, settings, cap, before,
                                          trace.params[name], trace.lr, decay, p)
                ctx.record(f"{name} after step {s + 1}",
                           B.compare(np.asarray(got), trace.params[name], bound))
            theta, moments = trajectory[s], (trace.m, trace.v)


def _loss_scale(trace, batches, theta, config, p: B.Precision) -> float:
    """The loss's error scale: each micro-batch's as in cross_entropy_mean.differential
    (2·max logit error + √(N·V)·u_acc·|L|), their mean, and the mean's k-term sum."""
    scales = []
    for (x, _), loss in zip(batches, trace.micro_losses, strict=True):
        logit_error = float(np.max(B.gpt_forward_bound(x, theta, config, p)))
        scales.append(2 * logit_error + p.sum_scale(x.size * config.vocab_size) * abs(loss))
    return float(np.mean(scales)) + (p.sum_scale(len(batches)) + p.u) * abs(trace.loss) + p.tiny


def _clipped_gradient_bound(trace, batches, theta, config, settings, p: B.Precision) -> dict:
    """δĝ by name: the bound on the error of the gradient AdamW is fed (see
    loop_matches_reference), λ included."""
    k = len(batches)
    # each micro-batch's gradient error, stage by stage through the backward pass
    # (gradient_budgets.gpt_backward_bound, as gpt_backward.differential), at the state the
    # backend reported
    micro = [gpt_backward_bound(x, y, theta, config, p) for x, y in batches]
    dg = {name: sum(B.budget(bound[name][1]) for bound in micro) / k
          + B.budget((p.sum_scale(k) + p.u) * sum(np.abs(g[name]) for g in trace.micro_grads) / k)
          for name in trace.grads}
    if settings.grad_clip <= 0:
        return dg
    N = sum(g.size for g in trace.grads.values())
    d_norm = (math.sqrt(sum(float(np.sum(np.square(d * np.ones_like(trace.grads[n]))))
                            for n, d in dg.items()))
              + float(B.budget((p.sum_scale(N) + p.u) * trace.norm)))

    def sigma(norm: float) -> float:
        return min(1.0, settings.grad_clip / (max(norm, 0.0) + 1e-6))

    s = trace.clip_scale
    d_sigma = max(sigma(trace.norm - d_norm) - s, s - sigma(trace.norm + d_norm)) \
        + float(B.budget(2 * p.u * s))
    return {name: s * dg[name] + np.abs(trace.grads[name]) * d_sigma
            + B.budget(p.u * np.abs(trace.clipped[name])) for name in trace.grads}
