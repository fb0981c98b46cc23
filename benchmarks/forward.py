"""Forward pass throughput: the fast backend against transformers' GPT-2 and against the
float64 reference, on the same GPT-2 small weights and tokens, in the same run.

Also the issue's usability bound: one float64 reference forward of GPT-2 small over 64
tokens must take under 5 s. Achieved FLOP rates use the forward FLOPs of spec/costs.py
with the attention term at the measured sequence length.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from benchmarks.report import Report, median_seconds
from gptspec.fast.model import GPT
from gptspec.reference import costs
from gptspec.reference.output import gpt_forward
from gptspec.spec import PRESETS, GPTConfig

REFERENCE_LIMIT_S = 5.0


def flops_per_token(config: GPTConfig, T: int) -> int:
    """Forward FLOPs per token of a T-token sequence (the causal window is T, not n_ctx)."""
    return costs.forward_flops_per_token(config.replace(n_ctx=T))


def transformers_model(params: dict, config: GPTConfig, dtype: torch.dtype,
                       device: str) -> torch.nn.Module | None:
    try:
        from gptspec.fast.hf_interop import to_hf_model

        return to_hf_model(params, config, dtype).to(device)
    except ImportError:
        return None


def interleaved_seconds(fns: dict[str, Callable[[], object]], repeats: int, device: str
                        ) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """Median seconds of each contender, timed in turn within every repeat so that all
    see the same machine load; and, for each pair, the median of the per-repeat ratios
    of their times (the fairer comparison on a shared machine)."""
    times: dict[str, list[float]] = {name: [] for name in fns}

    def timed(fn: Callable[[], object]) -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    for fn in fns.values():  # warm-up
        timed(fn)
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn))
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    ratios = {(a, b): statistics.median(tb / ta for ta, tb in zip(times[a], times[b], strict=True))
              for a in fns for b in fns if a != b}
    return medians, ratios


def run(report: Report, quick: bool) -> None:
    config = PRESETS["gpt2"]
    fast_cpu = GPT(config, seed=0).eval()  # torch's init is fast; the values do not matter
    params = fast_cpu.parameters_numpy()
    group = "forward"

    # The float64 reference, GPT-2 small, 64 tokens: the usability bound.
    T_ref = 64
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, size=(1, T_ref))
    cpu_times = []

    def reference_forward() -> None:
        c0 = time.process_time()
        gpt_forward(tokens, params, config)
        cpu_times.append(time.process_time() - c0)

    ref_s = median_seconds(reference_forward, repeats=1 if quick else 3, warmup=0)
    report.metric(group, "reference float64, GPT-2 small, 64 tokens", ref_s, "s",
                  f"wall time; goal < {REFERENCE_LIMIT_S:g} s")
    # CPU seconds of this process (all its threads): what the forward costs without the
    # other processes of a shared machine; above the wall time when BLAS runs in parallel
    report.metric(group, "reference float64, GPT-2 small, 64 tokens, CPU time",
                  statistics.median(cpu_times), "s", "process CPU seconds, all threads")
    report.ratio(group, "reference bound / reference time (64 tokens)",
                 REFERENCE_LIMIT_S / ref_s, goal=1.0, goal_text="≥ 1 (under 5 s)")
    ref_tps = T_ref / ref_s
    report.metric(group, "reference float64 (cpu), B=1 T=64", ref_tps, "tokens/s")
    report.metric(group, "reference float64 (cpu) FLOP rate, B=1 T=64",
                  ref_tps * flops_per_token(config, T_ref) / 1e9, "GFLOP/s",
                  "float64: compared with the float32 matmul rate")

    # fast vs transformers on the CPU, float32, at the reference's shape and a longer one.
    hf_cpu = transformers_model(params, config, torch.float32, "cpu")
    shapes = [(1, 64)] if quick else [(1, 64), (4, 256)]
    repeats = 5 if quick else 9
    for B, T in shapes:
        x = torch.as_tensor(np.random.default_rng(1).integers(0, config.vocab_size, (B, T)))
        fast_tps = compare_peers(report, f"(cpu) float32, B={B} T={T}", fast_cpu, hf_cpu, x,
                                 config, repeats, "cpu")
        if (B, T) == (1, T_ref):
            report.ratio(group, f"fast float32 / reference float64, B=1 T={T_ref}",
                         fast_tps / ref_tps)

    if torch.cuda.is_available():
        run_cuda(report, config, params, quick)


def compare_peers(report: Report, label: str, fast: torch.nn.Module,
                  hf: torch.nn.Module | None, x: torch.Tensor, config: GPTConfig,
                  repeats: int, device: str) -> float:
    """Throughput of the fast model and transformers, timed in turn, and their ratio.
    Returns the fast model's tokens/s."""
    contenders: dict[str, Callable[[], object]] = {"fast": lambda: fast(x)}
    if hf is not None:
        contenders["transformers"] = lambda: hf(x)
    medians, ratios = interleaved_seconds(contenders, repeats, device)
    n_tokens = x.numel()
    for name, seconds in medians.items():
        report.metric("forward", f"{name} {label}", n_tokens / seconds, "tokens/s")
    report.metric("forward", f"fast FLOP rate {label}",
                  n_tokens / medians["fast"] * flops_per_token(config, x.shape[1]) / 1e9,
                  "GFLOP/s")
    if hf is not None:  # tokens/s ratio = inverse time ratio
        report.ratio("forward", f"fast / transformers {label}",
                     ratios[("fast", "transformers")])
    return n_tokens / medians["fast"]


def run_cuda(report: Report, config: GPTConfig, params: dict, quick: bool) -> None:
    """bf16 forward throughput on the CUDA device, fast vs transformers."""
    fast = GPT.from_parameters(params, config, device="cuda", dtype=torch.bfloat16).eval()
    hf = transformers_model(params, config, torch.bfloat16, "cuda")
    B, T = (8, 1024)
    x = torch.as_tensor(np.random.default_rng(2).integers(0, config.vocab_size, (B, T)),
                        device="cuda")
    compare_peers(report, f"(cuda) bf16, B={B} T={T}", fast, hf, x, config,
                  5 if quick else 20, "cuda")
