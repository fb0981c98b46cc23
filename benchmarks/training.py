"""Training throughput: the fast backend against transformers' GPT2LMHeadModel.

Both models have the same shapes (built from a random GPT2Config, nothing downloaded),
see the same batch and take the same step: forward, mean cross-entropy, backward, AdamW
(the trainer's for the fast backend, torch.optim's for transformers).
Reported: tokens/s of each, their ratio (goal ≥ 1.2 on the CPU), and the fast backend's
model FLOPs utilisation against this machine's measured float32 matmul rate (goal ≥ 50%
for a GPT-2-small-shaped model). Model FLOPs per token: 6 N (N the parameters in matrix
products, the tied unembedding included) + 12 L T d (attention scores and their use).
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch
import torch.nn.functional as F

from benchmarks.machine import matmul_rate, sync
from benchmarks.report import Report
from gptspec.fast.model import GPT
from gptspec.fast.train import TrainSettings, make_optimizer
from gptspec.spec.config import GPTConfig

GROUP = "training"


def model_flops_per_token(config: GPTConfig, T: int) -> float:
    d, L = config.d_model, config.n_layers
    matmul_params = L * (3 * d * d + d * d + 2 * d * config.d_ff) + config.vocab_size * d
    return 6 * matmul_params + 12 * L * T * d


def _hf_model(config: GPTConfig, device: str):
    from transformers import GPT2Config, GPT2LMHeadModel

    hf = GPT2Config(vocab_size=config.vocab_size, n_positions=config.n_ctx, n_embd=config.d_model,
                    n_layer=config.n_layers, n_head=config.n_heads, n_inner=config.d_ff,
                    activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                    attn_pdrop=0.0, layer_norm_epsilon=config.ln_eps)
    return GPT2LMHeadModel(hf).to(device)  # type: ignore[arg-type]


def _fast_optimizer(model: GPT, device: str):
    """The trainer's AdamW (``gptspec train``'s: torch's fused kernel, called directly)."""
    return make_optimizer(model, TrainSettings(lr=1e-4, device=device))


def _hf_optimizer(model, device: str):
    """AdamW as a transformers user writes it: torch.optim's, its default kernel choice
    (fused where torch picks it, on CUDA)."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=(device == "cuda") or None)


def _step_fn(model, forward, make_opt, device: str, batch, amp: torch.dtype | None):
    opt = make_opt(model, device)
    x, y = batch

    def step() -> None:
        ctx = torch.autocast("cuda", dtype=amp) if amp else contextlib.nullcontext()
        with ctx:
            logits = forward(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)

    return step


def _interleaved_medians(fns, repeats: int) -> list[float]:
    """Median seconds of each function, timed in alternation (one warm-up each), so that
    a change in the machine's load affects every contender alike."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def measure(report: Report, name: str, config: GPTConfig, B: int, T: int, device: str,
            repeats: int, goal_ratio: float | None, goal_mfu: float | None) -> None:
    amp = torch.bfloat16 if device == "cuda" else None
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (B, T + 1), generator=gen).to(device)
    batch = (tokens[:, :-1], tokens[:, 1:])
    fast = GPT(config, device=device)
    hf = _hf_model(config, device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    n = 1024 if device == "cpu" else 8192
    # the peak is measured just before and after, and the higher taken (the load varies)
    before = matmul_rate(device, dtype, n, repeats=5)
    t_fast, t_hf = _interleaved_medians(
        [_step_fn(fast, fast, _fast_optimizer, device, batch, amp),
         _step_fn(hf, lambda x: hf(x).logits, _hf_optimizer, device, batch, amp)], repeats)
    peak = max(before, matmul_rate(device, dtype, n, repeats=5))
    report.metric(GROUP, f"{name} / measured matmul rate / {device} / {str(dtype)[6:]}", peak,
                  "FLOP/s", f"{n}×{n}, the higher of before and after")
    tokens_per_step = B * T
    fast_rate = report.metric(GROUP, f"{name} / fast / {device}", tokens_per_step / t_fast,
                              "tokens/s", f"B={B}, T={T}")
    hf_rate = report.metric(GROUP, f"{name} / transformers / {device}", tokens_per_step / t_hf,
                            "tokens/s", f"B={B}, T={T}")
    report.ratio(GROUP, f"{name}: fast / transformers tokens/s ({device})", fast_rate / hf_rate,
                 goal=goal_ratio, goal_text=f"≥ {goal_ratio}" if goal_ratio else "")
    mfu = fast_rate * model_flops_per_token(config, T) / peak
    report.ratio(GROUP, f"{name}: fast MFU vs measured matmul rate ({device})", mfu,
                 goal=goal_mfu, goal_text=f"≥ {goal_mfu:.0%}" if goal_mfu else "")


def run(report: Report, quick: bool) -> None:
    small = GPTConfig(vocab_size=256, n_ctx=64, d_model=128, n_layers=4, n_heads=4, d_ff=512)
    gpt2_small = GPTConfig(vocab_size=50257, n_ctx=1024, d_model=768, n_layers=12, n_heads=12,
                           d_ff=3072)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        measure(report, "shakespeare-char shapes", small, 12, 64, device, 5 if quick else 10,
                1.2 if device == "cpu" else None, None)
        if not quick or device == "cuda":
            B, T = (4, 256) if device == "cpu" else (16, 1024)
            measure(report, "GPT-2-small shapes", gpt2_small, B, T, device, 3,
                    1.2 if device == "cpu" else None, 0.5)
