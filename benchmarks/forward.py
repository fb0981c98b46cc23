"""Forward pass throughput: the fast backend against transformers' GPT-2 and against the
float64 reference, on the same GPT-2 small weights and tokens, in the same run.

Also the issue's usability bound: one float64 reference forward of GPT-2 small over 64
tokens must take under 5 s. Achieved FLOP rates use the forward FLOPs of spec/costs.py
with the attention term at the measured sequence length.
"""

from __future__ import annotations

import numpy as np
import torch
from gptspec.fast.model import GPT
from gptspec.reference import costs
from gptspec.reference.forward import gpt_forward
from gptspec.spec import PRESETS, GPTConfig

from benchmarks.report import Report, median_seconds

REFERENCE_LIMIT_S = 5.0


def flops_per_token(config: GPTConfig, T: int) -> int:
    """Forward FLOPs per token of a T-token sequence (the causal window is T, not n_ctx)."""
    return costs.forward_flops_per_token(config.replace(n_ctx=T))


def transformers_model(config: GPTConfig, params: dict, dtype: torch.dtype,
                       device: str) -> torch.nn.Module | None:
    try:
        from gptspec.fast.hf_interop import to_hf_model

        return to_hf_model(config, params, dtype).to(device)
    except ImportError:
        return None


def tokens_per_second(fn, n_tokens: int, repeats: int, device: str) -> float:
    def step() -> None:
        with torch.no_grad():
            fn()
        if device == "cuda":
            torch.cuda.synchronize()

    return n_tokens / median_seconds(step, repeats=repeats, warmup=1)


def run(report: Report, quick: bool) -> None:
    config = PRESETS["gpt2"]
    fast_cpu = GPT(config, seed=0).eval()  # torch's init is fast; the values do not matter
    params = fast_cpu.parameters_numpy()
    group = "forward"

    # The float64 reference, GPT-2 small, 64 tokens: the usability bound.
    T_ref = 64
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, size=(1, T_ref))
    ref_s = median_seconds(lambda: gpt_forward(tokens, params, config),
                           repeats=1 if quick else 3, warmup=0)
    report.metric(group, "reference float64, GPT-2 small, 64 tokens", ref_s, "s",
                  f"goal < {REFERENCE_LIMIT_S:g} s")
    report.ratio(group, "reference bound / reference time (64 tokens)",
                 REFERENCE_LIMIT_S / ref_s, goal=1.0, goal_text="≥ 1 (under 5 s)")
    ref_tps = T_ref / ref_s
    report.metric(group, "reference float64 (cpu), B=1 T=64", ref_tps, "tokens/s")
    report.metric(group, "reference float64 (cpu) FLOP rate, B=1 T=64",
                  ref_tps * flops_per_token(config, T_ref) / 1e9, "GFLOP/s",
                  "float64: compared with the float32 matmul rate")

    # fast vs transformers on the CPU, float32, at the reference's shape and a longer one.
    hf_cpu = transformers_model(config, params, torch.float32, "cpu")
    shapes = [(1, 64)] if quick else [(1, 64), (4, 256)]
    repeats = 3 if quick else 7
    for B, T in shapes:
        x = torch.as_tensor(np.random.default_rng(1).integers(0, config.vocab_size, (B, T)))
        label = f"(cpu) float32, B={B} T={T}"
        fast = tokens_per_second(lambda x=x: fast_cpu(x), B * T, repeats, "cpu")
        report.metric(group, f"fast {label}", fast, "tokens/s")
        report.metric(group, f"fast FLOP rate {label}",
                      fast * flops_per_token(config, T) / 1e9, "GFLOP/s")
        if hf_cpu is not None:
            hf = tokens_per_second(lambda x=x: hf_cpu(x), B * T, repeats, "cpu")
            report.metric(group, f"transformers {label}", hf, "tokens/s")
            report.ratio(group, f"fast / transformers {label}", fast / hf)
        if (B, T) == (1, T_ref):
            report.ratio(group, f"fast float32 / reference float64, B=1 T={T_ref}",
                         fast / ref_tps)

    if torch.cuda.is_available():
        run_cuda(report, config, params, quick)


def run_cuda(report: Report, config: GPTConfig, params: dict, quick: bool) -> None:
    """bf16 forward throughput on the CUDA device, fast vs transformers."""
    group = "forward"
    fast = GPT.from_parameters(config, params, device="cuda", dtype=torch.bfloat16).eval()
    hf = transformers_model(config, params, torch.bfloat16, "cuda")
    B, T = (8, 1024)
    x = torch.as_tensor(np.random.default_rng(2).integers(0, config.vocab_size, (B, T)),
                        device="cuda")
    repeats = 5 if quick else 20
    label = f"(cuda) bf16, B={B} T={T}"
    tps = tokens_per_second(lambda: fast(x), B * T, repeats, "cuda")
    report.metric(group, f"fast {label}", tps, "tokens/s")
    report.metric(group, f"fast FLOP rate {label}", tps * flops_per_token(config, T) / 1e9,
                  "GFLOP/s")
    if hf is not None:
        hf_tps = tokens_per_second(lambda: hf(x), B * T, repeats, "cuda")
        report.metric(group, f"transformers {label}", hf_tps, "tokens/s")
        report.ratio(group, f"fast / transformers {label}", tps / hf_tps)
