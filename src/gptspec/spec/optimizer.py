"""Spec entries: the optimizer — AdamW, gradient-norm clipping, the learning-rate schedule."""

from __future__ import annotations

import sympy as sp

from gptspec.spec.equation import Decision, Reading, Symbol, Tolerance, equation
from gptspec.spec.sources import BLUEPRINT, KINGMA_2015, LOSHCHILOV_2019, MICIKEVICIUS_2018, Source

# Defaults of the sympy forms (exact rationals; the trainer's settings override them).
LR, BETA1, BETA2, EPS = sp.Rational(1, 1000), sp.Rational(9, 10), sp.Rational(95, 100), sp.Rational(1, 10**8)
CLIP_EPS = sp.Rational(1, 10**6)  # PyTorch's, so backends agree
DECAY = sp.Rational(1, 10)  # the trainer's default weight decay


@equation(
    id="adamw_step",
    title="AdamW: Adam with decoupled weight decay",
    group="optimizer",
    latex=r"\begin{aligned} m_t &= \beta_1 m_{t-1} + (1 - \beta_1) g_t, \quad "
          r"v_t = \beta_2 v_{t-1} + (1 - \beta_2) g_t^2, \\ "
          r"\hat m_t &= \frac{m_t}{1 - \beta_1^t}, \quad \hat v_t = \frac{v_t}{1 - \beta_2^t}, \\ "
          r"\theta_t &= \theta_{t-1} - \eta_t \left( \frac{\hat m_t}{\sqrt{\hat v_t} + \varepsilon} "
          r"+ \lambda_{\mathrm{wd}}\, \theta_{t-1} \right) \end{aligned}",
    symbols=(
        Symbol(r"\theta", "(n,)", "a parameter"), Symbol("g", "(n,)", "its gradient at step t"),
        Symbol("m", "(n,)", "first-moment estimate"), Symbol("v", "(n,)", "second-moment estimate"),
        Symbol("t", "()", "step number, from 1"), Symbol(r"\eta_t", "()", "learning rate at step t"),
        Symbol(r"\beta_1, \beta_2", "()", "moment decay rates"),
        Symbol(r"\varepsilon", "()", "denominator floor"),
        Symbol(r"\lambda_{\mathrm{wd}}", "()", "weight decay"),
    ),
    sources=(Source(BLUEPRINT, "sec. 3.2"), Source(LOSHCHILOV_2019, "Algorithm 2"),
             Source(KINGMA_2015, "Algorithm 1")),
    reference="adamw_step",
    tolerance=Tolerance(r"\lambda\left(\sqrt{10k}\,u_{\mathrm{acc}}\big(|\theta_k| + "
                        r"\textstyle\sum_t \eta_t(|\mathrm{update}_t| + "
                        r"\lambda_{\mathrm{wd}}|\theta_t|)\big) \oplus u\sqrt{\textstyle\sum_t "
                        r"\theta_t^2}\right)",
                        reduction="1",
                        note="after k steps, update_t the step's update m̂/(√v̂ + ε): about 10 roundings "
                             "per element per step (the two moment updates, the two bias corrections, "
                             "the square root, the division, the decay and the subtraction), float32 "
                             "roundings (u_acc) in every dtype, adding in quadrature over the steps; a "
                             "16-bit backend also stores θ in its dtype, one rounding u|θ_t| per step "
                             "(the second term, 16 bit only); its check: λ·(√(10·k)·u_acc·(|θ_k| + Σ_t "
                             "η_t(|update_t| + λ_wd|θ_t|)) ⊕ u·√(Σ_t θ_t²)) after k steps (the second "
                             "term in 16 bit only)"),
    decisions=(
        Decision(
            question="How is the weight decay scaled?",
            readings=(
                Reading(Source(LOSHCHILOV_2019, "Algorithm 2, line 12"),
                        r"$\theta_t = \theta_{t-1} - \eta_t(\alpha \hat m_t/"
                        r"(\sqrt{\hat v_t}+\varepsilon) + \lambda\theta_{t-1})$ "
                        r"with $\eta_t$ a schedule multiplier and $\alpha$ the step size"),
                Reading(Source(BLUEPRINT, "sec. 3.2"),
                        "AdamW, decoupling weight decay from the gradient update; no formula"),
            ),
            decision=r"The learning rate $\eta_t$ (schedule included) multiplies both terms: "
                     r"the paper's $\alpha$ is folded into $\eta_t$ and its $\lambda$ is our "
                     r"$\lambda_{\mathrm{wd}}$ times $\alpha$ (the suite keeps $\lambda$ for its "
                     r"budget multiplier).",
            why="This is the parametrisation of PyTorch's AdamW (and of GPT-2/3 training "
                "recipes), so one weight-decay number means the same thing in the reference "
                "and in the fast backend; the decay stays decoupled (it never enters m or v).",
        ),
        Decision(
            question="Which parameters are decayed?",
            readings=(Reading(Source(LOSHCHILOV_2019, "Algorithm 2"), "every weight"),),
            decision="The trainer decays matrices (embeddings and linear maps) and not biases "
                     "or LayerNorm gains; adamw_step itself takes λ_wd per parameter.",
            why="Decaying a LayerNorm gain towards 0 or a bias towards 0 is not a prior "
                "anyone wants; GPT-2/3 recipes exclude them.",
        ),
        Decision(
            question="In what precision does a 16-bit (float16, bfloat16) backend take a step?",
            readings=(
                Reading(Source(KINGMA_2015, "Algorithm 1"),
                        r"real arithmetic, with $\varepsilon = 10^{-8}$"),
                Reading(Source(MICIKEVICIUS_2018, "sec. 3.1"),
                        "the optimizer updates a float32 master copy of the weights; a "
                        "16-bit copy of it is used by the forward and backward passes"),
            ),
            decision=r"The optimizer state $m, v$ and the whole update are float32; the "
                     r"parameter is read from and stored to the backend's dtype, one "
                     r"rounding per step. The conformance check budgets exactly that: the "
                     r"update's float32 roundings plus one rounding of the stored "
                     r"parameter per step (no master copy: the parameter the backend "
                     r"holds is the 16-bit one).",
            why=r"In 16 bit the step is not computable as written: $\varepsilon = 10^{-8}$ "
                r"is 0 in float16, $g^2$ underflows (float16) or keeps 8 bits (bfloat16), "
                r"and $\hat m/\sqrt{\hat v}$ divides two such numbers, so the update may be "
                r"off by its own size, or infinite where $v$ underflows. Float32 state is "
                r"what mixed-precision training does, and it keeps one contract for every "
                r"backend rather than failing them all.",
        ),
    ),
    sympy_inputs=(("theta", "(1, n)"), ("g", "(1, n)"), ("m", "(1, n)"), ("v", "(1, n)")),
)
def adamw_step(theta, g, m, v, t=1, lr=LR, beta1=BETA1, beta2=BETA2, eps=EPS, weight_decay=0):
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g.multiply_elementwise(g)
    m_hat = m / (1 - beta1**t)
    v_hat = v / (1 - beta2**t)
    step = sp.Matrix(m.rows, m.cols, lambda i, j: m_hat[i, j] / (sp.sqrt(v_hat[i, j]) + eps))
    return theta - lr * (step + weight_decay * theta), m, v


@equation(
    id="clip_grad_norm",
    title="Gradient-norm clipping",
    group="optimizer",
    latex=r"\|g\| = \sqrt{\textstyle\sum_p \sum_i g_{p,i}^2}, \quad "
          r"g \leftarrow g \cdot \min\!\left(1, \frac{c}{\|g\| + \varepsilon}\right)",
    symbols=(Symbol("g", "all parameters", "every gradient, taken together as one vector"),
             Symbol("c", "()", "the largest norm allowed"),
             Symbol(r"\varepsilon", "()", "10⁻⁶, keeps the ratio finite")),
    sources=(Source(BLUEPRINT, "sec. 3.2"),),
    reference="clip_grad_norm",
    tolerance=Tolerance(r"\lambda\,|g'_i|\,(\sqrt{N}\,u_{\mathrm{acc}} + 3u)\ \text{for each "
                        r"clipped entry } g'_i,\qquad \lambda\,(\sqrt{N}\,u_{\mathrm{acc}} + "
                        r"u)\,\|g\|\ \text{for the norm}",
                        reduction="n",
                        note="N = n entries in all: the norm is a sum of N squares (√N·u_acc relative) "
                             "and is stored once; a clipped entry is scaled by c/‖g‖, which adds the "
                             "norm's relative error and the division's and the product's roundings; its "
                             "check: λ·|g'|·(√N·u_acc + 3u) for each clipped entry; λ·(√N·u_acc + u)·‖g‖"),
    decisions=(
        Decision(
            question="Is clipping part of the optimizer?",
            readings=(Reading(Source(BLUEPRINT, "sec. 3.2"), "names AdamW only"),),
            decision="Clip the global norm to c = 1 before each step (c configurable; 0 turns "
                     "it off).",
            why="GPT-2/3 training recipes clip at 1.0; it keeps a rare large gradient from "
                "undoing training. The ε of 10⁻⁶ is PyTorch's, so backends agree.",
        ),
    ),
    sympy_inputs=(("g", "(1, n)"),),
)
def clip_grad_norm(g, max_norm=1, eps=CLIP_EPS):
    norm = sp.sqrt(sum(x**2 for x in g))
    return g * sp.Min(1, max_norm / (norm + eps)), norm


@equation(
    id="lr_schedule",
    title="Learning-rate schedule: linear warm-up, then cosine decay",
    group="optimizer",
    latex=r"\eta(s) = \begin{cases} \eta_{\max} \frac{s + 1}{W} & s < W \\ "
          r"\eta_{\min} + \tfrac12 (\eta_{\max} - \eta_{\min})"
          r"\left(1 + \cos\frac{\pi (s - W)}{S - W}\right) & W \le s < S \\ "
          r"\eta_{\min} & s \ge S \end{cases}",
    symbols=(Symbol("s", "()", "step, from 0"), Symbol("W", "()", "warm-up steps"),
             Symbol("S", "()", "step at which the decay ends"),
             Symbol(r"\eta_{\max}, \eta_{\min}", "()", "peak and final learning rates"),
             Symbol(r"\eta(s)", "()", "the learning rate at step s")),
    sources=(Source(LOSHCHILOV_2019, "sec. 3, schedule multiplier"), Source(BLUEPRINT, "sec. 3.2")),
    reference="lr_schedule",
    tolerance=Tolerance(r"\lambda\sqrt{8}\,u\,\eta_{\max}",
                        reduction="1",
                        note="the warm-up's or the cosine's few operations, about 8 independent "
                             "roundings, each relative to at most η_max; its check: λ·√8·u·η_max (the "
                             "schedule's roundings)"),
    notes="The warm-up starts at η_max/W, not 0, so the first step moves the parameters.",
)
def lr_schedule(step, max_lr, min_lr, warmup_steps, decay_steps):
    s = sp.sympify(step)
    cosine = min_lr + (max_lr - min_lr) * (1 + sp.cos(sp.pi * (s - warmup_steps)
                                                      / (decay_steps - warmup_steps))) / 2
    return sp.Piecewise((max_lr * (s + 1) / warmup_steps, s < warmup_steps),
                        (cosine, s < decay_steps), (min_lr, True))


@equation(
    id="train_loop",
    title="The training loop: batches, accumulation, clipping, schedule and decay, in order",
    group="optimizer",
    latex=r"\begin{aligned} (x^{(j)}, y^{(j)}) &= \operatorname{batches}(\text{seed}, "
          r"\text{rank}, s)_j, \quad j = 1, \dots, k, \\ "
          r"\bar L_s &= \frac1k \sum_{j=1}^{k} \bar L(x^{(j)}, y^{(j)}; \theta_s), \\ "
          r"g_s &= \nabla_\theta \bar L_s, \\ "
          r"\hat g_s &= g_s \cdot \min\!\left(1, \frac{c}{\|g_s\| + \varepsilon_c}\right), \\ "
          r"\eta_s &= \eta\!\left(s;\ W' = \min(W, S'),\ S'' = \max(S', W + 1)\right), \\ "
          r"\theta_{s+1, p} &= \operatorname{AdamW}\!\big(\theta_{s,p}, \hat g_{s,p};\ "
          r"t = s + 1,\ \eta_s, \\ &\qquad \lambda_{\mathrm{wd}}\,[\theta_p \text{ is a matrix}]\big) "
          r"\end{aligned}",
    symbols=(
        Symbol("s", "()", "the step, counted from 0"),
        Symbol(r"\theta_s", "every parameter", "the parameters before step s (from 0)"),
        Symbol(r"\theta_{s,p}", "parameter p's shape", "parameter p before step s"),
        Symbol(r"\theta_{s+1,p}", "parameter p's shape", "parameter p after step s"),
        Symbol(r"\theta_p", "parameter p's shape", "parameter p (its shape decides its decay)"),
        Symbol(r"\theta", "every parameter", "the parameters the gradient is taken in"),
        Symbol("g_s", "every parameter", "step s's gradient, averaged over the micro-batches"),
        Symbol(r"g_{s,p}", "parameter p's shape", "parameter p's part of g_s"),
        Symbol(r"\eta_s", "()", "step s's learning rate (lr_schedule under the horizon rule)"),
        Symbol(r"\eta", "()", "the schedule lr_schedule, as a function of the step"),
        Symbol("k", "()", "micro-batches per step (gradient accumulation)"),
        Symbol(r"x^{(j)}, y^{(j)}", "(B, T)", "micro-batch j's sequences and targets"),
        Symbol(r"\bar L", "()", "the mean cross-entropy per token (cross_entropy_mean)"),
        Symbol("c", "()", "the clipping norm; 0 turns clipping off"),
        Symbol(r"\varepsilon_c", "()", "10⁻⁶ (clip_grad_norm)"),
        Symbol("S'", "()", "the decay horizon: decay_steps, or the number of steps when 0"),
        Symbol("W", "()", "warm-up steps"),
        Symbol(r"\lambda_{\mathrm{wd}}", "()", "weight decay, applied to matrices only"),
    ),
    sources=(Source(BLUEPRINT, "sec. 3.2"), Source(LOSHCHILOV_2019, "Algorithm 2"),
             Source(KINGMA_2015, "Algorithm 1")),
    reference="train_loop",
    tolerance=Tolerance(r"\text{loss: } \lambda\Big(\overline{2\max|\varepsilon_Z| + \sqrt{N "
                        r"V}\,u_{\mathrm{acc}}\,|L_i|} + (\sqrt{k}\,u_{\mathrm{acc}} + "
                        r"u)\,|L|\Big);\quad \theta\text{: } \eta_s D + \lambda \sqrt{10}\, "
                        r"u\,\big(|\theta| + \eta_s(|\mathrm{update}| + 2D + "
                        r"\lambda_{\mathrm{wd}}|\theta_{s-1}|)\big),\quad D = "
                        r"\max_{\text{box}} \left|\frac{\hat m'}{\sqrt{\hat v'} + "
                        r"\varepsilon} - \frac{\hat m}{\sqrt{\hat v} + \varepsilon}\right|",
                        reduction="1",
                        note="per step, at the backend's own state; the box is the moments' error "
                             "propagated from the gradient budget; the loss's scale is "
                             "cross_entropy_mean's for each of the k micro-batches (L_i), their mean "
                             "(the bar), and the mean's own k-term sum; its check: per step at the "
                             "backend's state: the loss λ·(the micro-batches' mean of 2·max(logit error) "
                             "+ √(N·V)·u_acc·|L| + (√k·u_acc + u)·|L|); θ: η·D + λ·√10·u·(|θ| + "
                             "η(|update| + 2D + λ_wd|θ|)), D the largest change of m̂/(√v̂+ε) "
                             "over the moments' error box (a correct backend reaches η·D where "
                             "the box leaves a gradient's sign open)"),
    decisions=(
        Decision(
            question="Which batches does step s train on?",
            readings=(Reading(Source(BLUEPRINT, "sec. 3.2"),
                              "minibatches of sequences from the corpus; no sampling rule"),
                      Reading(Source(KINGMA_2015, "Algorithm 1"),
                              "a stochastic objective f_t at each step; no sampling rule")),
            decision="Step s on process r draws its k micro-batches in order from one NumPy "
                     "generator, default_rng([seed, r, s]): each micro-batch is B offsets "
                     "o ~ integers(0, N − T) of the N training tokens, sequence "
                     "tokens[o : o + T], targets tokens[o + 1 : o + T + 1].",
            why="A rule of (seed, rank, step) alone needs no sampler state in a checkpoint, "
                "so resuming is exact on any number of processes; stated exactly, a judge can "
                "replay a backend's loop batch for batch.",
        ),
        Decision(
            question="How are micro-batches accumulated, and where is the gradient clipped?",
            readings=(Reading(Source(BLUEPRINT, "sec. 3.2"), "one gradient per step; "
                              "no accumulation, no clipping"),
                      Reading(Source(LOSHCHILOV_2019, "Algorithm 2"),
                              "one batch gradient per step")),
            decision="The step's loss and gradient are the mean over its k micro-batches of "
                     "each micro-batch's mean cross-entropy (and its gradient), so k "
                     "micro-batches of B equal one batch of kB; the averaged gradient is "
                     "clipped once, after the last micro-batch and before AdamW.",
            why="Averaging keeps the learning rate's meaning independent of k; clipping the "
                "whole step's gradient is what the global norm is about.",
        ),
        Decision(
            question="What is the schedule's horizon when warm-up and decay overlap?",
            readings=(Reading(Source(LOSHCHILOV_2019, "sec. 3"), "a schedule multiplier "
                              "η_t, e.g. cosine annealing; no warm-up"),
                      Reading(Source(BLUEPRINT, "sec. 3.2"), "no schedule")),
            decision="S' = decay_steps, or the number of steps when it is 0; the warm-up is "
                     "cut to W' = min(W, S') and the cosine ends at S'' = max(S', W + 1), "
                     "then lr_schedule(s, η_max, η_min, W', S'').",
            why="Any settings give a defined schedule (no division by zero when W ≥ S'), and "
                "a run with fewer steps than its warm-up still reaches no more than η_max.",
        ),
        Decision(
            question="Which parameters does the loop decay?",
            readings=(Reading(Source(LOSHCHILOV_2019, "Algorithm 2"), "every weight"),
                      Reading(Source(BLUEPRINT, "sec. 3.2"), "AdamW; which weights not said")),
            decision="Those with two or more axes: wte, wpe, w_qkv, w_o, w_1, w_2, w_u. "
                     "Biases and LayerNorm gains and shifts (one axis) get λ_wd = 0.",
            why="As on adamw_step: decaying a gain or a bias towards 0 is no prior anyone "
                "wants; the rule by shape needs no list of names that could fall out of step "
                "with the schema.",
        ),
    ),
    sympy_inputs=(("theta", "(1, n)"), ("G", "[k](1, n)"), ("m", "(1, n)"), ("v", "(1, n)")),
)
def train_loop(theta, G, m, v, step=0, matrix=True, max_lr=LR, min_lr=LR / 10, warmup_steps=2,
               decay_steps=10, max_steps=10, max_norm=1, weight_decay=DECAY,
               beta1=BETA1, beta2=BETA2, eps=EPS):
    # One iteration of the loop for one parameter θ (the loop repeats it for s = 0, 1, …),
    # given its micro-batches' gradients G_j; the clipping norm is taken over θ alone here,
    # over every parameter together in the loop. The batches (a sampling rule, not an
    # equation) are the first Decision.
    g = sum(G, sp.zeros(*G[0].shape)) / len(G)
    if max_norm:
        g, _ = clip_grad_norm.sympy(g, max_norm=max_norm)
    horizon = decay_steps or max_steps
    lr = lr_schedule.sympy(step, max_lr, min_lr, min(warmup_steps, horizon),
                           max(horizon, warmup_steps + 1))
    return adamw_step.sympy(theta, g, m, v, t=step + 1, lr=lr, beta1=beta1, beta2=beta2,
                            eps=eps, weight_decay=weight_decay if matrix else 0)
