"""Spec entries: the optimizer — AdamW, gradient-norm clipping, the learning-rate schedule."""

from __future__ import annotations

import sympy as sp

from gptspec.spec.equation import Decision, Reading, Symbol, Tolerance, equation
from gptspec.spec.sources import BLUEPRINT, KINGMA_2015, LOSHCHILOV_2019, MICIKEVICIUS_2018, Source

# Defaults of the sympy forms (exact rationals; the trainer's settings override them).
LR, BETA1, BETA2, EPS = sp.Rational(1, 1000), sp.Rational(9, 10), sp.Rational(95, 100), sp.Rational(1, 10**8)
CLIP_EPS = sp.Rational(1, 10**6)  # PyTorch's, so backends agree


@equation(
    id="adamw_step",
    title="AdamW: Adam with decoupled weight decay",
    group="optimizer",
    latex=r"\begin{aligned} m_t &= \beta_1 m_{t-1} + (1 - \beta_1) g_t, \quad "
          r"v_t = \beta_2 v_{t-1} + (1 - \beta_2) g_t^2, \\ "
          r"\hat m_t &= \frac{m_t}{1 - \beta_1^t}, \quad \hat v_t = \frac{v_t}{1 - \beta_2^t}, \\ "
          r"\theta_t &= \theta_{t-1} - \eta_t \left( \frac{\hat m_t}{\sqrt{\hat v_t} + \epsilon} "
          r"+ \lambda\, \theta_{t-1} \right) \end{aligned}",
    symbols=(
        Symbol(r"\theta", "(n,)", "a parameter"), Symbol("g", "(n,)", "its gradient at step t"),
        Symbol("m", "(n,)", "first-moment estimate"), Symbol("v", "(n,)", "second-moment estimate"),
        Symbol("t", "()", "step number, from 1"), Symbol(r"\eta_t", "()", "learning rate at step t"),
        Symbol(r"\beta_1, \beta_2", "()", "moment decay rates"),
        Symbol(r"\epsilon", "()", "denominator floor"), Symbol(r"\lambda", "()", "weight decay"),
    ),
    sources=(Source(BLUEPRINT, "sec. 3.2"), Source(LOSHCHILOV_2019, "Algorithm 2"),
             Source(KINGMA_2015, "Algorithm 1")),
    reference="adamw_step",
    tolerance=Tolerance(r"\lambda u", reduction="1", note="elementwise"),
    decisions=(
        Decision(
            question="How is the weight decay scaled?",
            readings=(
                Reading(Source(LOSHCHILOV_2019, "Algorithm 2, line 12"),
                        r"$\theta_t = \theta_{t-1} - \eta_t(\alpha \hat m_t/"
                        r"(\sqrt{\hat v_t}+\epsilon) + \lambda\theta_{t-1})$ "
                        r"with $\eta_t$ a schedule multiplier and $\alpha$ the step size"),
                Reading(Source(BLUEPRINT, "sec. 3.2"),
                        "AdamW, decoupling weight decay from the gradient update; no formula"),
            ),
            decision=r"The learning rate $\eta_t$ (schedule included) multiplies both terms: "
                     r"the paper's $\alpha$ is folded into $\eta_t$ and its $\lambda$ is ours "
                     r"times $\alpha$.",
            why="This is the parametrisation of PyTorch's AdamW (and of GPT-2/3 training "
                "recipes), so one weight-decay number means the same thing in the reference "
                "and in the fast backend; the decay stays decoupled (it never enters m or v).",
        ),
        Decision(
            question="Which parameters are decayed?",
            readings=(Reading(Source(LOSHCHILOV_2019, "Algorithm 2"), "every weight"),),
            decision="The trainer decays matrices (embeddings and linear maps) and not biases "
                     "or LayerNorm gains; adamw_step itself takes λ per parameter.",
            why="Decaying a LayerNorm gain towards 0 or a bias towards 0 is not a prior "
                "anyone wants; GPT-2/3 recipes exclude them.",
        ),
        Decision(
            question="In what precision does a 16-bit (float16, bfloat16) backend take a step?",
            readings=(
                Reading(Source(KINGMA_2015, "Algorithm 1"),
                        r"real arithmetic, with $\epsilon = 10^{-8}$"),
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
            why=r"In 16 bit the step is not computable as written: $\epsilon = 10^{-8}$ "
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
          r"g \leftarrow g \cdot \min\!\left(1, \frac{c}{\|g\| + \epsilon}\right)",
    symbols=(Symbol("g", "all parameters", "every gradient, taken together as one vector"),
             Symbol("c", "()", "the largest norm allowed"),
             Symbol(r"\epsilon", "()", "10⁻⁶, keeps the ratio finite")),
    sources=(Source(BLUEPRINT, "sec. 3.2"),),
    reference="clip_grad_norm",
    tolerance=Tolerance(r"\lambda \sqrt{n}\,u", reduction="n"),
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
             Symbol(r"\eta_{\max}, \eta_{\min}", "()", "peak and final learning rates")),
    sources=(Source(LOSHCHILOV_2019, "sec. 3, schedule multiplier"), Source(BLUEPRINT, "sec. 3.2")),
    reference="lr_schedule",
    tolerance=Tolerance(r"\lambda u", reduction="1"),
    notes="The warm-up starts at η_max/W, not 0, so the first step moves the parameters.",
)
def lr_schedule(step, max_lr, min_lr, warmup_steps, decay_steps):
    s = sp.sympify(step)
    cosine = min_lr + (max_lr - min_lr) * (1 + sp.cos(sp.pi * (s - warmup_steps)
                                                      / (decay_steps - warmup_steps))) / 2
    return sp.Piecewise((max_lr * (s + 1) / warmup_steps, s < warmup_steps),
                        (cosine, s < decay_steps), (min_lr, True))
