"""On a CUDA device: bf16 training MFU of GPT-2 small at T = 1024, and generation
throughput with the KV cache. Without CUDA this module measures nothing.

MFU = achieved training FLOP/s ÷ the device's dense bf16 datasheet peak, with the
training FLOPs per token of spec/costs.py (6·N_mm + 6·L·T·d: the attention term is
the causal half of the full T × T products, so this MFU is slightly conservative
next to PaLM's 12·L·T·d). The goal is at least 50%.

The step and the decoding loop are plain functions of a device so that the tests run
them on the CPU with a tiny model (code path only, no timing).
"""

from __future__ import annotations

import time

import torch

from benchmarks.machine import dense_bf16_peak
from benchmarks.report import Report
from gptspec.fast.model import GPT
from gptspec.fast.train import mean_cross_entropy
from gptspec.reference import costs
from gptspec.spec import PRESETS, GPTConfig

MFU_GOAL = 0.5


def sync(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def training_tokens_per_second(config: GPTConfig, device: str, batch: int, steps: int,
                               warmup: int, compile: bool = True) -> float:
    """Tokens/s of full training steps (forward, loss, backward, AdamW) with float32
    master weights and bf16 autocast, the usual mixed-precision recipe."""
    model = GPT(config, device=device, seed=0).train()

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # the whole-sequence path (the input checks stay out), as Trainer(compile=True)
        return mean_cross_entropy(model._forward(x), y)

    # forward and loss compiled together: the float32 (B·T × V) logits are never stored
    # whole (on an H200, 453k against 374k tokens/s with the loss outside the compiled
    # model, and 223k eager: benchmarks/cuda_profile.py)
    loss_fn = torch.compile(loss_of) if compile else loss_of
    fused = torch.device(device).type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=fused)
    gen = torch.Generator(device=device).manual_seed(0)
    T = config.n_ctx
    data = torch.randint(0, config.vocab_size, (batch, T + 1), device=device, generator=gen)
    x, y = data[:, :-1], data[:, 1:]

    def step() -> None:
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
            loss = loss_fn(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):  # compilation and autotuning happen here
        step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return batch * T * steps / (time.perf_counter() - t0)


@torch.no_grad()
def generate_greedy(model: GPT, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding with the preallocated KV cache: the prompt in one call, then one
    token per call. Returns the new tokens (B, new_tokens)."""
    B, T = prompt.shape
    cache = model.new_cache(B, max_len=T + new_tokens)
    logits = model(prompt, cache=cache)
    out = []
    for _ in range(new_tokens):
        nxt = logits[:, -1].argmax(dim=-1, keepdim=True)
        out.append(nxt)
        logits = model(nxt, cache=cache)
    return torch.cat(out, dim=1)


def generation_tokens_per_second(model: GPT, batch: int, prompt_len: int, new_tokens: int,
                                 repeats: int, loop: str = "generate") -> float:
    """New tokens per second (all sequences together), median over ``repeats``.
    ``loop``: "generate" (gptspec.fast.generate, the library's path, token lists on the
    host) or "greedy" (generate_greedy: tokens stay on the device)."""
    from gptspec.fast.generate import GREEDY, generate

    device = model.wte.device
    gen = torch.Generator(device=device).manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (batch, prompt_len), device=device,
                           generator=gen)
    prompts = prompt.tolist()

    def decode(n: int) -> None:
        if loop == "greedy":
            generate_greedy(model, prompt, n)
        else:
            generate(model, prompts, n, GREEDY)

    decode(min(new_tokens, 8))  # warm-up
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        decode(new_tokens)
        sync(device)
        times.append(time.perf_counter() - t0)
    times.sort()
    return batch * new_tokens / times[len(times) // 2]


def run(report: Report, quick: bool) -> None:
    if not torch.cuda.is_available():
        print("[bench] gpu: no CUDA device; training MFU and generation throughput skipped")
        return
    torch.backends.cuda.matmul.allow_tf32 = True
    config = PRESETS["gpt2"]  # n_ctx = 1024
    name = torch.cuda.get_device_name()
    peak = dense_bf16_peak(name)
    batch = 16
    tps = training_tokens_per_second(config, "cuda", batch, steps=10 if quick else 30,
                                     warmup=3 if quick else 5)
    flops = tps * costs.training_flops_per_token(config)
    report.metric("training", "GPT-2 small bf16 training (cuda), B=16 T=1024", tps,
                  "tokens/s", name)
    report.metric("training", "GPT-2 small bf16 training FLOP rate (cuda)", flops / 1e9,
                  "GFLOP/s", "autocast bf16, forward + loss compiled, fused AdamW")
    if peak is not None:
        report.ratio("training", f"MFU: training FLOP/s / dense bf16 peak ({name})",
                     flops / peak, goal=MFU_GOAL, goal_text="≥ 0.5")

    model = GPT.from_parameters(GPT(config, device="cuda").state_dict(), config,
                                device="cuda", dtype=torch.bfloat16).eval()
    for batch_size in (1, 16):
        for loop in ("generate", "greedy"):
            gen_tps = generation_tokens_per_second(model, batch_size, prompt_len=64,
                                                   new_tokens=128 if quick else 512,
                                                   repeats=3 if quick else 5, loop=loop)
            what = "gptspec generate" if loop == "generate" else "device-side greedy loop"
            report.metric("generation", f"{what}, KV cache, bf16 (cuda), B={batch_size}",
                          gen_tps, "tokens/s", "GPT-2 small, 64-token prompt, greedy")
