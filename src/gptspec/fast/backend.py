"""The PyTorch backend under the conformance protocol (ARCHITECTURE.md).

``TorchBackend(device, dtype)`` runs ``forward(tokens, params, config)`` through
``gptspec.fast.model.GPT`` and exposes every operation of ``gptspec.fast.ops`` under its
reference name: NumPy float64 arrays in (rounded to the backend's dtype on the way in),
NumPy arrays out (16-bit results widened to float32, which NumPy can hold exactly).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

import gptspec
from gptspec.fast import ops
from gptspec.fast.model import GPT, compile_model, resolve_dtype
from gptspec.spec.config import GPTConfig
from gptspec.spec.operations import OptionalOperations
from gptspec.spec.parameters import check_parameters

# Operations whose output dtype is chosen, not inherited from a float input.
_TAKES_DTYPE = {"one_hot", "causal_mask"}


def float32_sums(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``method`` with PyTorch's reduced-precision reductions off (restored after): by
    default cuBLAS may add a 16-bit product's split-K partial sums in 16 bit, which the
    spec's float32 accumulation forbids (found on an H100 by thorough bfloat16
    conformance: benchmarks/cuda_reductions.py, docs/cuda-results.json). The flags are
    process-wide: calls in several threads overlap, so the first to enter saves them and
    the last to leave restores them (a thread's own products meanwhile sum in float32)."""

    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        with _Float32Sums.held():
            return method(*args, **kwargs)

    return run


class _Float32Sums:
    """The reduced-precision reduction flags held off while any thread is inside a call."""

    lock = threading.Lock()
    holders = 0
    saved = (True, True)

    @classmethod
    @contextlib.contextmanager
    def held(cls) -> Iterator[None]:
        matmul = torch.backends.cuda.matmul
        with cls.lock:
            if cls.holders == 0:
                cls.saved = (matmul.allow_bf16_reduced_precision_reduction,
                             matmul.allow_fp16_reduced_precision_reduction)
                matmul.allow_bf16_reduced_precision_reduction = False
                matmul.allow_fp16_reduced_precision_reduction = False
            cls.holders += 1
        try:
            yield
        finally:
            with cls.lock:
                cls.holders -= 1
                if cls.holders == 0:
                    (matmul.allow_bf16_reduced_precision_reduction,
                     matmul.allow_fp16_reduced_precision_reduction) = cls.saved


class TorchBackend(OptionalOperations):
    """The built-in PyTorch backend, for the conformance suite."""

    protocol_version = 2  # gptspec.conformance.protocol: forward(tokens, params, config)
    OPERATIONS = tuple(ops.__all__)  # spec.operations: every optional operation ops writes
    name = "torch"
    KEEP_MODELS = 4

    def __init__(self, device: str = "cpu", dtype: str = "float32", compile: bool = False) -> None:
        self.torch_dtype = resolve_dtype(dtype)
        self.dtype = str(self.torch_dtype).removeprefix("torch.")
        self.device = str(torch.device(device))
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available")
        self.compile = compile
        self.version = f"gptspec {gptspec.__version__}, torch {torch.__version__}"
        self._models: dict[GPTConfig, GPT] = {}

    def __repr__(self) -> str:
        return f"TorchBackend(device={self.device!r}, dtype={self.dtype!r}, compile={self.compile})"

    # --- the whole model -------------------------------------------------------------------

    def model(self, params: Mapping[str, Any], config: GPTConfig) -> GPT:
        """A model of ``config`` holding ``params``. The last few models are kept and
        refilled in place, so a compiled model is compiled once per configuration."""
        model = self._models.pop(config, None)
        if model is None:
            model = GPT.from_parameters(params, config, device=self.device,
                                        dtype=self.torch_dtype)
            model.requires_grad_(False)
            if self.compile:
                compile_model(model)
        else:
            check_parameters(dict(params), config)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    value = params[name]
                    p.copy_(value if isinstance(value, torch.Tensor)
                            else torch.as_tensor(np.asarray(value)))
        self._models[config] = model  # most recently used last
        while len(self._models) > self.KEEP_MODELS:
            self._models.pop(next(iter(self._models)))
        return model

    @float32_sums
    @torch.no_grad()
    def forward(self, tokens: Any, params: Mapping[str, Any], config: GPTConfig) -> np.ndarray:
        tokens_t = torch.as_tensor(np.asarray(tokens), device=self.device)
        return self._to_numpy(self.model(params, config)(tokens_t))

    # --- training (gptspec.fast.train) -----------------------------------------------------

    @float32_sums
    def gpt_backward(self, tokens: Any, targets: Any, params: Mapping[str, Any],
                     config: GPTConfig) -> tuple[float, dict[str, np.ndarray]]:
        from gptspec.fast import train

        rounded = {k: self._to_torch(np.asarray(v)) for k, v in params.items()}
        return train.gpt_backward(tokens, targets, rounded, config, self.device, self.torch_dtype)

    @float32_sums
    def adamw_trajectory(self, params: Mapping[str, Any], grads: list, lrs: list, beta1: float,
                         beta2: float, eps: float, weight_decay: float) -> list:
        from gptspec.fast import train

        return train.adamw_trajectory(dict(params), grads, lrs, beta1, beta2, eps, weight_decay,
                                      self.device, self.torch_dtype)

    @float32_sums
    @torch.no_grad()
    def clip_grad_norm(self, grads: Mapping[str, Any], max_norm: float
                       ) -> tuple[dict[str, np.ndarray], float]:
        """torch's own clipping (as the trainer uses it), on gradients of this dtype."""
        tensors = {k: self._to_torch(np.asarray(g)) for k, g in grads.items()}
        holders = []
        for g in tensors.values():
            holder = torch.nn.Parameter(torch.zeros_like(g))
            holder.grad = g.clone()
            holders.append(holder)
        norm = torch.nn.utils.clip_grad_norm_(holders, max_norm)
        clipped = {k: self._to_numpy(h.grad) for k, h in zip(tensors, holders, strict=True)
                   if h.grad is not None}
        return clipped, float(norm)

    @float32_sums
    def train_losses(self, tokens: Any, params: Mapping[str, Any], config: GPTConfig,
                     steps: int, seed: int, resume_at: int | None = None) -> list[float]:
        from gptspec.fast import train

        return train.train_losses(tokens, dict(params), config, steps, seed, resume_at,
                                  device=self.device)

    @float32_sums
    def train_loop(self, tokens: Any, params: Mapping[str, Any], config: GPTConfig,
                   settings: Any) -> tuple[list, list, list]:
        """The trainer's own loop (``gptspec.fast.train.Trainer``, as ``gptspec train`` runs
        it), with parameters of this dtype. It trains float32 or float64 parameters only:
        its 16-bit training is autocast over float32 parameters, on CUDA."""
        from gptspec.fast import train

        if self.torch_dtype not in (torch.float32, torch.float64):
            raise ValueError(f"the trainer keeps float32 or float64 parameters, not {self.dtype}")
        rounded = {k: self._to_torch(np.asarray(v)) for k, v in params.items()}
        return train.train_loop(tokens, rounded, config, settings, self.device, self.torch_dtype)

    # --- generation (gptspec.fast.generate, .sampling), under the reference functions' names -

    @float32_sums
    def generate(self, prompts: Any, params: Mapping[str, Any], config: GPTConfig,
                 max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, eot_token: int | None = None,
                 rng: np.random.Generator | None = None, return_logits: bool = False) -> Any:
        """``gptspec.reference.generate``'s signature: the seed of the torch sampler is
        drawn from ``rng`` (a NumPy Generator), logits come back as NumPy arrays."""
        from gptspec.fast.generate import generate
        from gptspec.fast.sampling import Sampling

        model = self.model(params, config)
        sampling = Sampling(temperature, top_k, top_p)
        if not sampling.greedy and rng is None:
            raise ValueError("sampling (temperature > 0) needs an explicit seeded rng")
        seed = None if rng is None else int(rng.integers(2**63 - 1))
        prompts_ = [[int(t) for t in np.asarray(p).reshape(-1)] for p in prompts]
        result = generate(model, prompts_, max_new_tokens, sampling, eot_token=eot_token,
                          seed=seed, return_logits=return_logits)
        if not return_logits:
            return result
        tokens, logits = result
        return tokens, [z.numpy() for z in logits]

    @float32_sums
    @torch.no_grad()
    def sampling_distribution(self, z: Any, temperature: float = 1.0, top_k: int | None = None,
                              top_p: float | None = None) -> np.ndarray:
        from gptspec.fast.sampling import sampling_distribution

        return self._to_numpy(sampling_distribution(self._to_torch(np.asarray(z)), temperature,
                                                    top_k, top_p))

    # --- measured sizes and costs (gptspec.conformance.checks_costs) -----------------------

    @staticmethod
    def parameter_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
        from gptspec.fast import measure

        return measure.parameter_shapes(config)

    @staticmethod
    def count_flops(config: GPTConfig, batch: int, T: int, backward: bool = False) -> int:
        from gptspec.fast import measure

        return measure.count_flops(config, batch, T, backward)

    def kv_cache_nbytes(self, config: GPTConfig, batch: int) -> int:
        from gptspec.fast import measure

        return measure.kv_cache_nbytes(config, batch, self.torch_dtype)

    @staticmethod
    def saved_activation_bytes(config: GPTConfig, batch: int, T: int) -> int:
        from gptspec.fast import measure

        return measure.saved_activation_bytes(config, batch, T)

    # --- the tokenizer (gptspec.conformance.checks_tokenizer) ------------------------------

    @staticmethod
    def tokenizer() -> Any:
        """The fast tokenizer, for the suite's tokenizer area."""
        from gptspec.fast.tokenizer import FastTokenizerBackend

        return FastTokenizerBackend()

    # --- the operations --------------------------------------------------------------------

    def _operation(self, name: str) -> Callable[..., Any]:
        return self._wrap(name)

    def _wrap(self, name: str) -> Callable[..., Any]:
        """Operation ``name`` of ops on NumPy arguments (the tests and meta/ override it)."""
        fn = getattr(ops, name)

        @float32_sums
        @torch.no_grad()
        def op(*args: Any, **kwargs: Any) -> Any:
            args_t = [self._to_torch(a) for a in args]
            kwargs_t = {k: self._to_torch(v) for k, v in kwargs.items()}
            if name in _TAKES_DTYPE:
                kwargs_t.setdefault("dtype", self.torch_dtype)
            if name == "causal_mask":
                kwargs_t.setdefault("device", self.device)
            return self._from_torch(fn(*args_t, **kwargs_t))

        op.__name__ = op.__qualname__ = name
        op.__doc__ = fn.__doc__
        return op

    def _to_torch(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self._to_torch(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], np.ndarray):
            return type(value)(self._to_torch(v) for v in value)
        if isinstance(value, (np.ndarray, np.generic)):
            array = np.asarray(value)
            if array.dtype.kind in "iub":
                return torch.as_tensor(array.astype(np.int64), device=self.device)
            # float64 → the backend's dtype: the one rounding of the inputs
            return torch.as_tensor(array, device=self.device).to(self.torch_dtype)
        return value

    def _from_torch(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self._to_numpy(value)
        if isinstance(value, tuple):
            return tuple(self._from_torch(v) for v in value)
        return value

    @staticmethod
    def _to_numpy(t: torch.Tensor) -> np.ndarray:
        t = t.detach()
        if t.dtype in ops.HALF_DTYPES:
            t = t.float()  # exact: every 16-bit value is a float32 value
        return t.cpu().numpy()
