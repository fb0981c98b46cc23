"""On a CUDA device: bf16 training MFU of GPT-2 small at T = 1024, and batch-1 and
batch-16 decoding, against the card's measured limits and transformers in the same run.

MFU = training FLOP/s ÷ the dense bf16 datasheet peak (goal ≥ 0.55), FLOPs per token from
reference/costs.py (6·N_mm + 6·L·T·d, the causal half of the attention products: slightly
conservative); the measured matmul rate is reported beside it. Batch-1 decoding is given
as a fraction of the bandwidth limit, measured copy bandwidth ÷ the bytes one step must
read (goal ≥ 0.3). The steps and loops are plain functions of a device so that the tests
run them on the CPU with a tiny model (code path only, no timing).
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.machine import copy_bandwidth, dense_bf16_peak, matmul_rate
from benchmarks.report import Report
from gptspec.fast.generate import _capture
from gptspec.fast.model import GPT
from gptspec.fast.train import mean_cross_entropy
from gptspec.reference import costs
from gptspec.spec import PRESETS, GPTConfig

MFU_GOAL = 0.55
DECODE_GOAL = 0.3  # batch-1 tokens/s over the bandwidth limit


def sync(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def training_tokens_per_second(config: GPTConfig, device: str, batch: int, steps: int,
                               warmup: int, compile: bool = True,
                               vocab_multiple: int = 64,
                               mode: str | None = None) -> tuple[float, float]:
    """Tokens/s of full training steps (forward, loss, backward, AdamW) with float32
    master weights and bf16 autocast, the usual mixed-precision recipe; the unembedding
    padded to ``vocab_multiple`` as ``gptspec train --compile`` does on CUDA; ``mode``:
    torch.compile's (e.g. "max-autotune-no-cudagraphs": inductor times its own matmul
    kernels against cuBLAS's). Also the first step's loss against the eager, unpadded
    model's: |a − b| / b."""
    torch._dynamo.reset()  # each configuration compiled afresh, for its own shapes
    model = GPT(config, device=device, seed=0).train()
    model.vocab_multiple = vocab_multiple

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # the whole-sequence path (the input checks stay out), as Trainer(compile=True)
        return mean_cross_entropy(model._forward(x), y)

    # forward and loss compiled together: the float32 (B·T × V) logits are never stored
    # whole (on an H200, 453k against 374k tokens/s with the loss outside the compiled
    # model, and 223k eager: benchmarks/cuda_profile.py)
    loss_fn = torch.compile(loss_of, dynamic=False, mode=mode) if compile else loss_of
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

    with torch.no_grad(), torch.autocast(device_type=torch.device(device).type,
                                         dtype=torch.bfloat16):
        model.vocab_multiple = 1
        eager = mean_cross_entropy(model._forward(x), y).item()
        model.vocab_multiple = vocab_multiple
        first = loss_fn(x, y).item()
    for _ in range(warmup):  # compilation and autotuning happen here
        step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return batch * T * steps / (time.perf_counter() - t0), abs(first - eager) / eager


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


class GraphedGreedy:
    """Greedy decoding on the device alone: the one-token step (``KVCache.static_plan``)
    and the argmax that feeds it back captured as one CUDA graph (``generate._capture``)
    and replayed, the host only launching it. On the CPU the same step runs eagerly (for
    the tests). ``compile``: the step traced whole by torch.compile first (these options,
    e.g. ``{}`` for inductor's defaults), so the graph replays its fused kernels rather
    than the eager step's ~200: whether fusion pays at batch 1 is what it measures."""

    def __init__(self, model: GPT, batch: int, max_len: int,
                 compile: dict[str, Any] | None = None) -> None:
        self.model = model
        self.cache = model.new_cache(batch, max_len=max_len)
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=model.wte.device)
        self.logits: torch.Tensor | None = None
        step: Callable[[], torch.Tensor] = self._step
        if compile is not None:  # one trace: no graph break, no shape that changes
            step = torch.compile(self._step, fullgraph=True, dynamic=False, **compile)
        self.replay: Callable[[], object] = step
        if model.wte.device.type == "cuda":
            with torch.no_grad():
                self.replay, _ = _capture(step)

    def _step(self) -> torch.Tensor:
        self.logits = self.model.run(self.token, self.cache.static_plan(), last_only=True)[:, -1]
        self.token.copy_(self.logits.argmax(dim=-1, keepdim=True))
        return self.logits

    @torch.no_grad()
    def __call__(self, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """The new tokens (B, new_tokens), as generate_greedy picks them."""
        self.cache.reset()
        first = self.model(prompt, cache=self.cache)[:, -1]
        self.token.copy_(first.argmax(dim=-1, keepdim=True))
        out = torch.empty(prompt.shape[0], new_tokens, dtype=torch.long, device=prompt.device)
        for i in range(new_tokens):
            out[:, i : i + 1].copy_(self.token)
            self.replay()  # (the last step's token is unused, as in generate_greedy)
        return out


def generation_tokens_per_second(model: GPT, batch: int, prompt_len: int, new_tokens: int,
                                 repeats: int, loop: str = "generate") -> float:
    """New tokens per second (all sequences together), median over ``repeats``.
    ``loop``: "generate" (gptspec.fast.generate, the library's path: on CUDA each step a
    graph replay), "generate-eager" (the same, its kernels launched one by one), "greedy"
    (generate_greedy: tokens stay on the device), "graph" (GraphedGreedy) or
    "compiled-graph" (GraphedGreedy, its step compiled by inductor)."""
    from gptspec.fast.generate import GREEDY, generate

    device = model.wte.device
    gen = torch.Generator(device=device).manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (batch, prompt_len), device=device,
                           generator=gen)
    prompts = prompt.tolist()
    decoder = None
    if loop in ("graph", "compiled-graph"):
        decoder = GraphedGreedy(model, batch, prompt_len + new_tokens,
                                compile={} if loop == "compiled-graph" else None)

    def decode(n: int) -> None:
        if decoder is not None:
            decoder(prompt, n)
        elif loop == "greedy":
            generate_greedy(model, prompt, n)
        else:
            generate(model, prompts, n, GREEDY, cuda_graph=loop == "generate")

    decode(min(new_tokens, 8))  # warm-up
    return batch * new_tokens / _median_time(lambda: decode(new_tokens), repeats, device)


def _median_time(fn: Callable[[], object], repeats: int, device: str | torch.device) -> float:
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def graph_step_error(model: GPT, prompt: torch.Tensor,
                     compile: dict[str, Any] | None = None) -> float:
    """‖a − b‖ / ‖b‖ of the next-token logits after ``prompt``'s last token: ``a`` from a
    GraphedGreedy replay (its step compiled with ``compile``'s options, if given), ``b``
    from the library's cached step (model(token, cache))."""
    decoder = GraphedGreedy(model, prompt.shape[0], prompt.shape[1] + 2, compile=compile)
    with torch.no_grad():
        decoder(prompt, 1)  # prefill, then one replay on the prefill's greedy token
        assert decoder.logits is not None
        graphed = decoder.logits.float().clone()
        cache = model.new_cache(prompt.shape[0], max_len=prompt.shape[1] + 2)
        token = model(prompt, cache=cache)[:, -1].argmax(dim=-1, keepdim=True)
        eager = model(token, cache=cache)[:, -1].float()
    return float((graphed - eager).norm() / eager.norm())


def same_tokens(model: GPT, batch: int, prompt_len: int, new_tokens: int) -> float:
    """The fraction of greedy tokens that ``generate`` picks alike with and without its
    CUDA graphs."""
    from gptspec.fast.generate import GREEDY, generate

    gen = torch.Generator(device=model.wte.device).manual_seed(2)
    prompts = torch.randint(0, model.config.vocab_size, (batch, prompt_len),
                            device=model.wte.device, generator=gen).tolist()
    a, b = (generate(model, prompts, new_tokens, GREEDY, cuda_graph=g) for g in (True, False))
    pairs = [(x, y) for p, q in zip(a, b, strict=True) for x, y in zip(p, q, strict=True)]
    return sum(x == y for x, y in pairs) / len(pairs)


def transformers_tokens_per_second(batch: int, prompt_len: int, new_tokens: int,
                                   repeats: int, static: bool, device: str = "cuda") -> float:
    """The peer: transformers' GPT-2 small (random weights, bf16) ``generate``, greedy,
    exactly ``new_tokens`` new tokens; ``static``: its static KV cache, with which
    transformers compiles the forward itself (torch.compile, CUDA graphs)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config()).to(device, torch.bfloat16).eval()
    gen = torch.Generator(device=device).manual_seed(0)
    prompt = torch.randint(0, 50257, (batch, prompt_len), device=device, generator=gen)
    options: dict = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens,
                     "do_sample": False, "pad_token_id": 0,
                     "attention_mask": torch.ones_like(prompt)}
    if static:
        options["cache_implementation"] = "static"

    def decode() -> None:
        with torch.no_grad():
            model.generate(prompt, **options)

    decode()  # compilation (static) and warm-up
    decode()
    return batch * new_tokens / _median_time(decode, repeats, device)


def decode_bytes_per_token(model: GPT, context: int) -> int:
    """The fewest bytes one batch-1 decoding step must read: every weight once (one row of
    the position table) and the keys and values of ``context`` cached positions."""
    c = model.config
    size = model.wte.element_size()
    weights = sum(p.numel() for n, p in model.named_parameters() if n != "wpe")
    weights += c.d_model if model.wpe is not None else 0
    return size * (weights + 2 * c.n_layers * context * c.d_attn)


def run(report: Report, quick: bool) -> None:
    """The measurements in order of importance; GPTSPEC_BENCH_SECONDS, where set, is the time
    they have (a short GPU lease): once it is spent, the rest are skipped and named."""
    if not torch.cuda.is_available():
        print("[bench] gpu: no CUDA device; training MFU and generation throughput skipped")
        return
    deadline = time.monotonic() + float(os.environ.get("GPTSPEC_BENCH_SECONDS", "inf"))
    torch.backends.cuda.matmul.allow_tf32 = True
    config = PRESETS["gpt2"]  # n_ctx = 1024
    name = torch.cuda.get_device_name()
    peak = dense_bf16_peak(name)
    matmul = matmul_rate("cuda", torch.bfloat16, 8192, 5)
    report.metric("machine", "bf16 matmul (cuda)", matmul / 1e9, "GFLOP/s", "8192³, random")
    bandwidth = copy_bandwidth("cuda", 2 << 30, 5)
    report.metric("machine", "memory copy (cuda)", bandwidth / 1e9, "GB/s", "read + write")
    flops_per_token = costs.training_flops_per_token(config)

    def train(batch: int, multiple: int, mode: str | None = None) -> None:
        label = f"B={batch} T=1024" + (", vocab padded to 64" if multiple > 1 else "")
        label += f", compiled with mode={mode}" if mode else ""
        tps, error = training_tokens_per_second(config, "cuda", batch,
                                                steps=10 if quick else 20, warmup=3,
                                                vocab_multiple=multiple, mode=mode)
        torch._dynamo.reset()
        flops = tps * flops_per_token
        report.metric("training", f"GPT-2 small bf16 training (cuda), {label}", tps,
                      "tokens/s", name)
        report.metric("training", f"compiled loss against the eager one, |a−b|/b, {label}",
                      error, "", "bf16 autocast; about 1e-3 expected")
        report.ratio("training", f"training FLOP/s / measured bf16 matmul rate, {label}",
                     flops / matmul)
        if peak is not None:
            report.ratio("training", f"MFU: training FLOP/s / dense bf16 peak, {label}",
                         flops / peak, goal=MFU_GOAL, goal_text=f"≥ {MFU_GOAL}")

    model = GPT.from_parameters(GPT(config, device="cuda").state_dict(), config,
                                device="cuda", dtype=torch.bfloat16).eval()
    prompt_len, new = 64, 128 if quick else 512
    repeats = 3 if quick else 5
    gen = torch.Generator(device="cuda").manual_seed(1)
    probe = torch.randint(0, config.vocab_size, (1, prompt_len), device="cuda", generator=gen)
    limit = bandwidth / decode_bytes_per_token(model, prompt_len + new // 2)
    report.metric("generation", "batch-1 bandwidth limit (cuda)", limit, "tokens/s",
                  "copy bandwidth / bytes read per token")
    loops = {"generate": "gptspec generate", "generate-eager": "gptspec generate, no graphs",
             "greedy": "device-side greedy loop", "graph": "device-side CUDA-graph loop",
             "compiled-graph": "device-side CUDA-graph loop, step compiled"}

    def decode(loop: str) -> None:
        what = loops[loop]
        if loop in ("graph", "compiled-graph"):
            error = graph_step_error(model, probe,
                                     compile={} if loop == "compiled-graph" else None)
            report.metric("generation", f"{what}: logits ‖a−b‖/‖b‖ against the eager step",
                          error, "", "bf16")
        if loop == "generate":
            alike = same_tokens(model, 4, prompt_len, 64)
            report.metric("generation", "generate: tokens alike with and without graphs",
                          alike, "fraction", "greedy, 4 × 64 tokens")
        for batch_size in (1, 16):
            tps = generation_tokens_per_second(model, batch_size, prompt_len, new, repeats, loop)
            report.metric("generation", f"{what}, KV cache, bf16 (cuda), B={batch_size}",
                          tps, "tokens/s", f"GPT-2 small, {prompt_len}-token prompt, greedy")
            if batch_size == 1:
                report.ratio("generation", f"{what}, B=1: fraction of the bandwidth limit",
                             tps / limit, goal=DECODE_GOAL, goal_text=f"≥ {DECODE_GOAL}")

    def peer(static: bool, batch_size: int) -> None:
        what = "transformers generate, " + ("static cache, compiled" if static else "dynamic cache")
        tps = transformers_tokens_per_second(batch_size, prompt_len, new, repeats, static)
        report.metric("generation", f"{what}, bf16 (cuda), B={batch_size}", tps,
                      "tokens/s", f"GPT-2 small, {prompt_len}-token prompt, greedy")
        if batch_size == 1:
            report.ratio("generation", f"{what}, B=1: fraction of the bandwidth limit",
                         tps / limit)

    # (what, the most seconds it needs on an H100 or H200, compilation included: a task
    # starts only while that much of GPTSPEC_BENCH_SECONDS is left, so that a short lease
    # ends with its log; max-autotune's kernel search is the long one, docs/cuda-results.json)
    tasks: list[tuple[str, float, Callable[[], None]]] = [
        ("training B=32, padded vocabulary", 90, lambda: train(32, 64)),
        ("decoding, device-side CUDA graph of the compiled step", 90,
         lambda: decode("compiled-graph")),
        ("decoding, transformers static cache B=1", 90, lambda: peer(True, 1)),
        ("decoding, gptspec generate", 60, lambda: decode("generate")),
        ("decoding, device-side CUDA graph", 40, lambda: decode("graph")),
        ("training B=32, padded vocabulary, max-autotune", 480,
         lambda: train(32, 64, "max-autotune-no-cudagraphs")),
        ("training B=16, padded vocabulary", 80, lambda: train(16, 64)),
        ("decoding, gptspec generate without graphs", 60, lambda: decode("generate-eager")),
        ("training B=16, vocabulary as is", 80, lambda: train(16, 1)),
        ("decoding, transformers static cache B=16", 60, lambda: peer(True, 16)),
        ("decoding, transformers dynamic cache B=1", 60, lambda: peer(False, 1)),
        ("decoding, device-side greedy loop", 60, lambda: decode("greedy")),
    ]
    if quick:
        tasks = tasks[:2]
    for what, needs, task in tasks:
        if deadline - time.monotonic() < needs:
            print(f"[bench] gpu: {what}: skipped, GPTSPEC_BENCH_SECONDS left < {needs:.0f}s")
            continue
        t0 = time.monotonic()
        rows = len(report.metrics), len(report.ratios)
        try:
            task()
        except Exception as error:  # one failure must not cost the lease's other figures
            traceback.print_exc()
            print(f"[bench] gpu: {what}: FAILED: {type(error).__name__}: "
                  f"{(str(error).splitlines() or [''])[0]}")
            torch.cuda.empty_cache()
        print(f"[bench] gpu: {what}: {time.monotonic() - t0:.0f}s", flush=True)
        # the figures as they come: a run cut by the lease keeps them in its log
        for row in report.metrics[rows[0]:] + report.ratios[rows[1]:]:
            print(f"[bench]   {row.name}: {row.value:.6g}", flush=True)
