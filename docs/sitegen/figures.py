"""Figures made at build time: the loss curve and attention patterns of a tiny model.

The model is trained for a few seconds on the bytes of a Python standard-library module
(a corpus every machine has) with the fast backend (``gptspec.fast.model.GPT``). Its
trained parameters are then read back in the canonical schema and the attention weights
are computed with the float64 *reference* functions, so the patterns shown are the
spec's, not an artefact of the backend's fused kernels. Results are cached under
``.cache/figures`` by a key of everything that determines them.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import shutil
import textwrap as corpus_module  # its source is the training text
import time
from pathlib import Path
from typing import Any

import numpy as np

FIGURES = ("loss-curve.png", "attention.png")
SEED = 0
STEPS = 200
BATCH = 16
LEARNING_RATE = 3e-3
EVAL_EVERY = 20
CONFIG = dict(vocab_size=256, n_ctx=32, d_model=64, n_layers=2, n_heads=4, d_ff=256)
PROMPT = "def wrap(text, width=70):"


class FigureError(RuntimeError):
    """The figures could not be made; the message says why."""


def corpus() -> bytes:
    return Path(inspect.getsourcefile(corpus_module) or "").read_bytes()


def _cache_key(data: bytes) -> str:
    import torch

    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(json.dumps([CONFIG, SEED, STEPS, BATCH, LEARNING_RATE, PROMPT]).encode())
    h.update(torch.__version__.encode())
    h.update(model_class()[1].encode())
    h.update(data)
    return h.hexdigest()[:16]


def _batches(tokens: np.ndarray, n_ctx: int, rng: np.random.Generator):
    while True:
        starts = rng.integers(0, len(tokens) - n_ctx - 1, size=BATCH)
        x = np.stack([tokens[s : s + n_ctx] for s in starts])
        y = np.stack([tokens[s + 1 : s + n_ctx + 1] for s in starts])
        yield x, y


def model_class() -> tuple[Any, str]:
    """The fast backend's model class, and how the figures page names it."""
    from gptspec.fast.model import GPT

    return GPT, "the fast backend (gptspec.fast.model.GPT)"


def build_model(config: Any) -> Any:
    return model_class()[0](config)


def train(data: bytes) -> tuple[Any, dict[str, np.ndarray], dict[str, list[float]]]:
    """Train the tiny model; returns (config, float64 schema parameters, loss history)."""
    import torch

    from gptspec.spec import GPTConfig

    config = GPTConfig(**CONFIG)
    tokens = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    # One thread: the model is tiny, and on a shared machine more threads only contend.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(config, tokens)
    finally:
        torch.set_num_threads(threads)


History = dict[str, list[float]]


def _train(config: Any, tokens: np.ndarray) -> tuple[Any, dict[str, np.ndarray], History]:
    import torch
    import torch.nn.functional as F

    split = int(0.9 * len(tokens))
    train_tokens, val_tokens = tokens[:split], tokens[split:]
    torch.manual_seed(SEED)
    model = build_model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.1)
    rng = np.random.default_rng(SEED)
    val_rng = np.random.default_rng(SEED + 1)
    val_batches = [next(_batches(val_tokens, config.n_ctx, val_rng)) for _ in range(4)]
    history: dict[str, list[float]] = {"step": [], "train": [], "val_step": [], "val": []}

    def loss_of(x: np.ndarray, y: np.ndarray) -> torch.Tensor:
        logits = model(torch.from_numpy(x))
        targets = torch.from_numpy(y).reshape(-1)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)

    batches = _batches(train_tokens, config.n_ctx, rng)
    for step in range(STEPS + 1):
        if step % EVAL_EVERY == 0:
            model.eval()
            with torch.no_grad():
                val = float(np.mean([loss_of(x, y).item() for x, y in val_batches]))
            history["val_step"].append(step)
            history["val"].append(val)
            model.train()
        if step == STEPS:
            break
        x, y = next(batches)
        loss = loss_of(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        history["step"].append(step)
        history["train"].append(loss.item())
    params = {name: p.detach().double().numpy().copy() for name, p in model.named_parameters()}
    return config, params, history


def attention_patterns(tokens: np.ndarray, params: dict[str, np.ndarray], config: Any
                       ) -> list[np.ndarray]:
    """Per layer, the (h, T, T) attention weights, computed with the reference functions."""
    from gptspec import reference as ref
    from gptspec.reference.block import BLOCK, block_parameters

    H = ref.input_representation(ref.token_embedding(tokens, params["wte"]),
                                 ref.positional_embedding(len(tokens), params["wpe"]))
    block = BLOCK[config.norm]
    patterns = []
    for layer in range(config.n_layers):
        p = block_parameters(params, layer)
        x = H
        if config.norm == "pre":
            x = ref.layer_norm(H, p["ln_1.weight"], p["ln_1.bias"], config.ln_eps)
        Q, K, _ = ref.qkv_projection(x, p["attn.w_qkv"], p.get("attn.b_qkv"))
        A = ref.attention_weights(ref.split_heads(Q, config.n_heads),
                                  ref.split_heads(K, config.n_heads),
                                  ref.causal_mask(len(tokens)))
        patterns.append(A)
        H = block(H, p, config)
    return patterns


def plot_loss(history: dict[str, list[float]], path: Path) -> None:
    import matplotlib.pyplot as plt

    # bits per byte, the unit of the Open questions page (a byte per token: nats / ln 2)
    bits = 1 / np.log(2)
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
    ax.plot(history["step"], np.multiply(history["train"], bits), lw=0.8, alpha=0.6,
            label="training batch")
    ax.plot(history["val_step"], np.multiply(history["val"], bits), "o-", ms=3,
            label="validation")
    ax.axhline(8, color="grey", ls=":", lw=1, label="uniform over 256 bytes")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (bits per byte)")
    ax.set_title("Training a 2-layer model on textwrap.py")
    ax.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_attention(patterns: list[np.ndarray], text: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    n_layers, n_heads = len(patterns), patterns[0].shape[0]
    labels = [repr(c)[1:-1] if c != " " else "␣" for c in text]
    fig, axes = plt.subplots(n_layers, n_heads, figsize=(3.0 * n_heads, 3.1 * n_layers),
                             dpi=100, squeeze=False)
    for layer, A in enumerate(patterns):
        for head in range(n_heads):
            ax = axes[layer][head]
            ax.imshow(A[head], cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
            ax.set_xticks(range(len(labels)), labels, fontsize=5, rotation=90)
            ax.set_yticks(range(len(labels)), labels, fontsize=5)
    fig.supxlabel("key position j (attended to)")
    fig.supylabel("query position i")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def make_figures(out_dir: Path, cache_root: Path) -> dict[str, float]:
    """Write the figures into ``out_dir``; returns a few numbers about the run."""
    import matplotlib

    matplotlib.use("Agg")
    data = corpus()
    try:
        cache = cache_root / _cache_key(data)
    except ImportError as err:
        raise FigureError(f"the figures need gptspec.fast to train a model: {err}") from None
    stats_file = cache / "stats.json"
    if not stats_file.is_file():
        try:
            started = time.perf_counter()
            config, params, history = train(data)
            seconds = time.perf_counter() - started
        except ImportError as err:
            raise FigureError(f"the figures need gptspec.fast to train a model: {err}") from None
        tokens = np.frombuffer(PROMPT.encode(), dtype=np.uint8).astype(np.int64)
        tmp = cache.with_name(cache.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        plot_loss(history, tmp / "loss-curve.png")
        plot_attention(attention_patterns(tokens, params, config), PROMPT, tmp / "attention.png")
        stats = {"train_seconds": seconds, "steps": STEPS,
                 "final_val_bits": history["val"][-1] / np.log(2),
                 "model": model_class()[1]}
        (tmp / "stats.json").write_text(json.dumps(stats))
        for old in cache_root.iterdir():  # results of other code or settings
            if old != tmp:
                shutil.rmtree(old, ignore_errors=True)
        tmp.rename(cache)
    from sitegen.spec_pages import write_if_changed

    for name in FIGURES:
        write_if_changed(out_dir / name, (cache / name).read_bytes())
    return json.loads(stats_file.read_text())

