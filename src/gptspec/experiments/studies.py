"""The three studies as data: which models are compared, for how long, and what is held
fixed. Nothing here trains; :mod:`gptspec.experiments.runner` runs what this describes.

A study is a set of *arms* (a model configuration and tokenizer each) trained with the
same data split, batch, optimiser and schedule shape and the same seeds, evaluated on the
whole validation split. Where an arm's cost per token differs, its number of steps makes
training compute equal: steps = C / (tokens per step · training FLOPs per token), from
the spec's ``training_flops_per_token``; matched parameter counts come from
``param_count_total``. ``FULL`` is what the site's answers come from; ``QUICK`` runs the
same code on tiny models for a few steps, to prove the harness, and answers nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gptspec.reference.costs import (
    param_count_token_embedding,
    param_count_total,
    param_count_unembedding,
    training_flops_per_token,
)
from gptspec.spec.config import GPTConfig

STUDY_NAMES = ("vocab", "tying", "head-width")
BYTE_LEVEL = 256  # the vocabulary of the byte tokenizer (no merges)
SEEDS = 3  # per arm, by default: the fewest that give a t interval worth the name


@dataclass(frozen=True)
class Scale:
    """The sizes and lengths a study is run at; everything an arm does not vary."""

    name: str  # "full" or "quick"
    d_model: int
    n_layers: int
    n_heads: int
    n_ctx: int
    batch_size: int
    max_chars: int | None  # characters of the corpus read (None: all of it)
    val_fraction: float  # the end of the text, cut at a line start
    lr: float
    min_lr: float
    warmup_fraction: float  # of each arm's steps
    weight_decay: float
    grad_clip: float
    curve_points: int  # evaluations on the curve windows during training
    curve_windows: int  # validation windows of n_ctx + 1 tokens the curves are measured on
    eval_batch: int  # windows per forward pass when evaluating
    vocab_sizes: tuple[int, ...]
    vocab_budget_steps: int  # the vocabulary study's compute: this many steps of bytes' model
    tying_vocab: int
    tying_steps: int
    head_shapes: tuple[tuple[int, int], ...]  # (h, d_H)
    head_budget_steps: int  # the head-width study's compute: steps of the (n_heads, d/h) model

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.n_ctx

    def base_config(self, vocab_size: int) -> GPTConfig:
        """The model every arm starts from: GPT-2's block (pre-LN, tanh GELU, biases, tied
        embeddings, learned positions), d_ff = 4·d_model."""
        return GPTConfig(vocab_size=vocab_size, n_ctx=self.n_ctx, d_model=self.d_model,
                         n_layers=self.n_layers, n_heads=self.n_heads, d_ff=4 * self.d_model)


# lr 2e-3 (min 2e-4) for every arm: of 1e-3, 2e-3 and 4e-3 it gave the lowest validation
# loss for both ends of the vocabulary study (bytes and BPE 8192) in a 250-step check, one
# seed (2026-11-24); not tuned per arm, as the Open questions page says.
FULL = Scale(
    name="full", d_model=128, n_layers=4, n_heads=4, n_ctx=128, batch_size=16,
    max_chars=None, val_fraction=0.05, lr=2e-3, min_lr=2e-4, warmup_fraction=0.05,
    weight_decay=0.1, grad_clip=1.0, curve_points=20, curve_windows=48, eval_batch=16,
    vocab_sizes=(256, 512, 1024, 2048, 4096, 8192), vocab_budget_steps=1100,
    tying_vocab=4096, tying_steps=600,
    head_shapes=((1, 128), (2, 64), (4, 32), (8, 16), (16, 8), (4, 16), (4, 64)),
    head_budget_steps=840,
)

QUICK = Scale(
    name="quick", d_model=32, n_layers=2, n_heads=4, n_ctx=32, batch_size=8,
    max_chars=1 << 20, val_fraction=0.05, lr=2e-3, min_lr=2e-4, warmup_fraction=0.05,
    weight_decay=0.1, grad_clip=1.0, curve_points=4, curve_windows=8, eval_batch=16,
    vocab_sizes=(256, 512, 1024), vocab_budget_steps=40,
    tying_vocab=512, tying_steps=40,
    head_shapes=((1, 32), (4, 8), (8, 4), (4, 16)),
    head_budget_steps=40,
)

SCALES = {"full": FULL, "quick": QUICK}


@dataclass(frozen=True)
class Arm:
    """One configuration of a study: its tokenizer (256: bytes; more: BPE of that size
    trained on the training split), model and number of steps."""

    name: str  # file-safe: "bpe-1024", "untied-d128", "h4-dH32"
    label: str  # for tables and legends
    vocab: int
    config: GPTConfig
    steps: int
    x: float  # the varied quantity, for plots
    group: str = ""  # a family of arms drawn alike (the head widths: derived or free)


@dataclass(frozen=True)
class Comparison:
    """Arm ``a`` against arm ``b``, with what the pair holds equal."""

    a: str
    b: str
    matched: str


@dataclass(frozen=True)
class Study:
    name: str
    title: str
    question: str  # the Notes' open question, in our words
    varied: str  # the plots' axis
    arms: tuple[Arm, ...]
    baseline: str
    comparisons: tuple[Comparison, ...]
    matched: str  # what is held equal across every arm
    scale: Scale = field(repr=False)

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)


def non_embedding_params(config: GPTConfig) -> int:
    """Parameters outside the token embedding and the unembedding (Kaplan's N, with the
    positional embedding, which does not depend on the vocabulary, kept)."""
    return (param_count_total(config) - param_count_token_embedding(config)
            - param_count_unembedding(config))


def steps_for_compute(budget_flops: int, config: GPTConfig, tokens_per_step: int) -> int:
    """The number of steps whose training FLOPs (the spec's C_train per token × tokens)
    come nearest to ``budget_flops``."""
    per_step = tokens_per_step * training_flops_per_token(config)
    return max(1, round(budget_flops / per_step))


def width_matching_params(target: int, config: GPTConfig, tied: bool) -> int:
    """The d_model (a multiple of n_heads, d_ff = 4·d_model) whose model, tied or untied,
    has the parameter count nearest to ``target``; on a tie the smaller width."""
    h = config.n_heads

    def count(d: int) -> int:
        return param_count_total(config.replace(d_model=d, d_ff=4 * d, tied_embeddings=tied))

    widths = range(h, 8 * config.d_model + 1, h)
    return min(widths, key=lambda d: (abs(count(d) - target), d))


def training_settings(arm: Arm, scale: Scale, seed: int) -> dict:
    """The trainer's settings (``gptspec.fast.train.TrainSettings`` fields) for one run:
    the schedule's shape is the same for every arm (warm-up over the same fraction of its
    steps, cosine decay to min_lr at its last step)."""
    return {"batch_size": scale.batch_size, "max_steps": arm.steps, "lr": scale.lr,
            "min_lr": scale.min_lr,
            "warmup_steps": max(1, round(scale.warmup_fraction * arm.steps)),
            "decay_steps": 0, "weight_decay": scale.weight_decay, "beta1": 0.9,
            "beta2": 0.99, "eps": 1e-8, "grad_clip": scale.grad_clip, "grad_accum": 1,
            "seed": seed, "device": "cpu", "precision": "float32"}


def curve_steps(steps: int, points: int) -> list[int]:
    """The steps after which the curve windows are evaluated: ``points`` of them (fewer if
    there are fewer steps), evenly spaced, the last step the last of them."""
    return sorted({max(1, round(k * steps / points)) for k in range(1, points + 1)})


# --- the three designs ----------------------------------------------------------------------


def vocab_study(scale: Scale) -> Study:
    """Bytes and BPE vocabularies of several sizes, the same non-embedding model (tied
    embeddings: the vocabulary adds V·d_model parameters), equal training FLOPs."""
    base = scale.base_config(BYTE_LEVEL)
    budget = scale.vocab_budget_steps * scale.tokens_per_step * training_flops_per_token(base)
    arms = []
    for v in scale.vocab_sizes:
        config = base.replace(vocab_size=v)
        arms.append(Arm(name="bytes" if v == BYTE_LEVEL else f"bpe-{v}",
                        label="bytes (256)" if v == BYTE_LEVEL else f"BPE {v}", vocab=v,
                        config=config, steps=steps_for_compute(budget, config,
                                                               scale.tokens_per_step),
                        x=v))
    return Study(
        name="vocab", title="Vocabulary size",
        question="How does the vocabulary size n_vocab trade computational cost against how "
                 "well the model predicts text?",
        varied="vocabulary size V", arms=tuple(arms), baseline="bytes",
        comparisons=tuple(Comparison(a.name, "bytes", "non-embedding size and training FLOPs")
                          for a in arms if a.name != "bytes"),
        matched="the non-embedding model and the training FLOPs", scale=scale)


def tying_study(scale: Scale) -> Study:
    """Tied and untied embeddings at one BPE vocabulary: at the same d_model and steps,
    and at the same parameter count (an untied model narrowed to the tied one's count, a
    tied model widened to the untied one's)."""
    v = scale.tying_vocab
    tied = scale.base_config(v)
    untied = tied.replace(tied_embeddings=False)
    d = scale.d_model
    narrow = width_matching_params(param_count_total(tied), tied, tied=False)
    wide = width_matching_params(param_count_total(untied), tied, tied=True)

    def arm(is_tied: bool, width: int) -> Arm:
        config = tied.replace(d_model=width, d_ff=4 * width, tied_embeddings=is_tied)
        kind = "tied" if is_tied else "untied"
        return Arm(name=f"{kind}-d{width}", label=f"{kind}, d_model = {width}", vocab=v,
                   config=config, steps=scale.tying_steps, x=param_count_total(config),
                   group=kind)

    arms = (arm(True, d), arm(False, d), arm(False, narrow), arm(True, wide))
    return Study(
        name="tying", title="Tied or untied embeddings",
        question="What does tying the unembedding to the embedding (W_U = W_Eᵀ) do to what "
                 "the model learns?",
        varied="parameters", arms=arms, baseline=f"tied-d{d}",
        comparisons=(Comparison(f"untied-d{d}", f"tied-d{d}", "d_model and steps"),
                     Comparison(f"untied-d{narrow}", f"tied-d{d}", "parameters and steps"),
                     Comparison(f"tied-d{wide}", f"untied-d{d}", "parameters and steps")),
        matched="the vocabulary, depth, heads and steps", scale=scale)


def head_width_study(scale: Scale) -> Study:
    """Heads h and head width d_H at one d_model: the shapes with h·d_H = d_model, and at
    fixed h widths whose h·d_H ≠ d_model (the free d_head), at equal training FLOPs."""
    base = scale.base_config(BYTE_LEVEL)
    budget = scale.head_budget_steps * scale.tokens_per_step * training_flops_per_token(base)
    arms = []
    for h, d_head in scale.head_shapes:
        derived = h * d_head == scale.d_model
        config = base.replace(n_heads=h, d_head=None if derived else d_head)
        assert config.d_head == d_head
        arms.append(Arm(name=f"h{h}-dH{d_head}", label=f"h = {h}, d_H = {d_head}",
                        vocab=BYTE_LEVEL, config=config,
                        steps=steps_for_compute(budget, config, scale.tokens_per_step),
                        x=d_head, group="h·d_H = d_model" if derived else "h·d_H ≠ d_model"))
    baseline = f"h{scale.n_heads}-dH{scale.d_model // scale.n_heads}"
    return Study(
        name="head-width", title="Head width",
        question="How does the head width d_H (and with it the number of heads h) change "
                 "what the attention layers can capture?",
        varied="head width d_H", arms=tuple(arms), baseline=baseline,
        comparisons=tuple(Comparison(a.name, baseline, "d_model and training FLOPs")
                          for a in arms if a.name != baseline),
        matched="d_model, depth, d_ff and the training FLOPs", scale=scale)


DESIGNS = {"vocab": vocab_study, "tying": tying_study, "head-width": head_width_study}


def design(name: str, scale: Scale) -> Study:
    return DESIGNS[name](scale)
