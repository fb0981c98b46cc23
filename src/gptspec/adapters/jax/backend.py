"""The JAX model under the conformance protocol: ``JaxBackend(device="cpu", dtype=...)``.

Every operation of :mod:`gptspec.adapters.jax.ops` is exposed under its reference name
(inputs rounded to the dtype on the way in; 16-bit results widened to float32, exactly),
besides ``forward``, ``gpt_backward`` (``jax.value_and_grad`` of the mean cross-entropy),
``adamw_trajectory``, ``clip_grad_norm``, ``sampling_distribution`` and ``generate``.
Each call is jit-compiled with array arguments traced and everything else static, one
jitted function per operation and static values, so a shape seen once is never compiled
again; generation pads every context to n_ctx, so one compilation per configuration and
batch size serves every step. It does not import torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import gptspec
from gptspec.adapters.inputs import check_ids, check_tokens
from gptspec.adapters.jax import ops, sampling
from gptspec.adapters.kit import OptionalOperations, generate_by_forward
from gptspec.conformance.protocol import NotApplicable
from gptspec.reference.sampling import check_sampling_settings
from gptspec.spec.config import GPTConfig
from gptspec.spec.parameters import check_parameters

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

# Operations whose result dtype is chosen by the backend, not inherited from an input.
_TAKES_DTYPE = {"one_hot", "causal_mask"}


def _is_array(value: Any) -> bool:
    return isinstance(value, (np.ndarray, np.generic, jax.Array)) and not isinstance(
        value, (bool, np.bool_))


def _is_traced(value: Any) -> bool:
    """Arrays, and dicts or sequences of them, are traced; everything else is static."""
    if isinstance(value, dict):
        return all(_is_array(v) for v in value.values())
    if isinstance(value, (list, tuple)) and value:
        return all(_is_array(v) for v in value)
    return _is_array(value)


class JaxBackend(OptionalOperations):
    """The decoder-only GPT in JAX, jit-compiled on the CPU, in float32 or a 16-bit dtype
    with float32 accumulation."""

    protocol_version = 2  # gptspec.conformance.protocol: forward(tokens, params, config)
    name = "jax"
    OPERATIONS = tuple(ops.__all__)  # every optional operation ops writes (adapters.kit)

    def __init__(self, device: str = "cpu", dtype: str = "float32") -> None:
        if dtype not in DTYPES:
            # declined, not broken: the run is recorded as refused, with this reason
            raise NotApplicable(f"the JAX backend computes in {', '.join(DTYPES)}, "
                                f"not {dtype!r}")
        if device != "cpu":
            raise ValueError(f"the JAX backend runs on the CPU only, not on {device!r}")
        self.dtype = dtype
        self.device = device
        self.jnp_dtype = DTYPES[dtype]
        self._cpu = jax.devices("cpu")[0]
        self.version = f"gptspec {gptspec.__version__}, jax {jax.__version__}"
        self._jitted: dict[tuple, Callable[..., Any]] = {}

    def __repr__(self) -> str:
        return f"JaxBackend(device={self.device!r}, dtype={self.dtype!r})"

    # --- conversions -------------------------------------------------------------------------

    def _in(self, value: Any) -> Any:
        """NumPy in: floats rounded once to the backend's dtype, integers as int32."""
        if isinstance(value, dict):
            return {k: self._in(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)) and value and all(_is_array(v) for v in value):
            return type(value)(self._in(v) for v in value)
        if _is_array(value):
            array = np.asarray(value)
            if array.dtype.kind in "iub":
                return jax.device_put(array.astype(np.int32), self._cpu)
            return jax.device_put(array.astype(self.jnp_dtype), self._cpu)
        return value

    @staticmethod
    def _out(value: Any) -> Any:
        """NumPy out; 16-bit results widened to float32 (exactly)."""
        if isinstance(value, jax.Array):
            array = np.asarray(value)
            return array.astype(np.float32) if array.dtype.itemsize == 2 and \
                array.dtype.kind not in "iub" else array
        if isinstance(value, tuple):
            return tuple(JaxBackend._out(v) for v in value)
        if isinstance(value, dict):
            return {k: JaxBackend._out(v) for k, v in value.items()}
        return value

    def _run(self, key: str, fn: Callable[..., Any], args: tuple) -> Any:
        """``fn(*args)`` jit-compiled: the traced arguments (arrays, and dicts or lists of
        them) are traced, the others bound as static values. One jitted function is kept
        per (key, static values); JAX keeps its compiled code per shape and dtype."""
        traced = tuple(i for i, a in enumerate(args) if _is_traced(a))
        statics = tuple((i, a) for i, a in enumerate(args) if i not in traced)
        cache_key = (key, traced, statics)
        jitted = self._jitted.get(cache_key)
        if jitted is None:
            def bound(*traced_args: Any) -> Any:
                full: list[Any] = [None] * len(args)
                for i, a in zip(traced, traced_args, strict=True):
                    full[i] = a
                for i, a in statics:
                    full[i] = a
                return fn(*full)

            jitted = self._jitted[cache_key] = jax.jit(bound)
        return jitted(*(args[i] for i in traced))

    def _call(self, name: str, fn: Callable[..., Any], args: tuple) -> Any:
        """An operation on NumPy arguments: converted in, run jitted, converted out."""
        return self._out(self._run(name, fn, tuple(self._in(a) for a in args)))

    # --- the operations ------------------------------------------------------------------------

    def _operation(self, name: str) -> Callable[..., Any]:
        fn = getattr(ops, name)
        signature = inspect.signature(fn)

        def op(*args: Any, **kwargs: Any) -> Any:
            if name in _TAKES_DTYPE:
                kwargs.setdefault("dtype", self.jnp_dtype)
            # every argument by position, defaults filled in: the split into traced and
            # static arguments needs a fixed arity
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            full = tuple(bound.arguments.values())
            if name == "one_hot":
                check_ids(np.asarray(full[0]), full[1])
            if name == "token_embedding":
                check_ids(np.asarray(full[0]), np.shape(full[1])[0])
            return self._call(name, fn, full)

        op.__name__ = op.__qualname__ = name
        op.__doc__ = fn.__doc__
        return op

    # --- the whole model ---------------------------------------------------------------------

    def forward(self, tokens: Any, params: Mapping[str, Any], config: GPTConfig) -> np.ndarray:
        tokens = np.asarray(tokens)
        check_tokens(tokens, config)
        check_parameters(dict(params), config)
        return self._call("gpt_forward", ops.gpt_forward, (tokens, dict(params), config))

    # --- training ------------------------------------------------------------------------------

    def gpt_backward(self, tokens: Any, targets: Any, params: Mapping[str, Any],
                     config: GPTConfig) -> tuple[float, dict[str, np.ndarray]]:
        """The mean cross-entropy of the logits (computed in the accumulation dtype) and
        its gradient by parameter name, by ``jax.value_and_grad`` through ``gpt_forward``."""
        tokens, targets = np.asarray(tokens), np.asarray(targets)
        check_tokens(tokens, config)
        check_ids(targets, config.vocab_size)
        check_parameters(dict(params), config)
        loss, grads = self._call("gpt_backward", _loss_and_grads,
                                 (tokens, targets, dict(params), config))
        return float(loss), {k: np.asarray(g, dtype=np.float64) for k, g in grads.items()}

    def adamw_trajectory(self, params: Mapping[str, Any], grads: list, lrs: list, beta1: float,
                         beta2: float, eps: float, weight_decay: float) -> list:
        """The parameters after each step of AdamW (decoupled decay, bias correction), fed
        ``grads`` at the learning rates ``lrs``; parameters and moments stored in the
        backend's dtype, each update computed in the accumulation dtype."""
        theta = self._in(dict(params))
        m = {k: jnp.zeros_like(v) for k, v in theta.items()}
        v = {k: jnp.zeros_like(x) for k, x in theta.items()}
        out = []
        for t, (g, lr) in enumerate(zip(grads, lrs, strict=True), start=1):
            theta, m, v = self._run("adamw_step", _adamw_step,
                                    (theta, self._in(dict(g)), m, v, jnp.float32(lr),
                                     jnp.float32(t), beta1, beta2, eps, weight_decay))
            out.append({k: np.asarray(self._out(x), dtype=np.float64) for k, x in theta.items()})
        return out

    def clip_grad_norm(self, grads: Mapping[str, Any], max_norm: float
                       ) -> tuple[dict[str, np.ndarray], float]:
        """‖g‖ over every gradient together (a sum of squares in the accumulation dtype);
        when it exceeds ``max_norm`` every gradient is scaled by max_norm / (‖g‖ + 10⁻⁶)."""
        # max_norm traced, not static: it changes with every call
        clipped, norm = self._run("clip_grad_norm", _clip,
                                  (self._in(dict(grads)), jnp.float32(max_norm)))
        return self._out(clipped), float(norm)

    # --- generation ----------------------------------------------------------------------------

    def sampling_distribution(self, z: Any, temperature: float = 1.0, top_k: int | None = None,
                              top_p: float | None = None) -> np.ndarray:
        check_sampling_settings(temperature, _as_int(top_k), top_p)
        logits = self._in(np.asarray(z, dtype=np.float64))
        return np.asarray(self._distribution(logits, temperature, _as_int(top_k), top_p))

    def _distribution(self, logits: jax.Array, temperature: float, top_k: int | None,
                      top_p: float | None) -> jax.Array:
        if temperature == 0:
            return self._run("greedy", sampling.greedy, (logits,))
        nucleus = top_p is not None and top_p < 1

        def distribution(z: jax.Array, tau: jax.Array, p: jax.Array) -> jax.Array:
            return sampling.sampling_distribution(z, tau, p, top_k=top_k, nucleus=nucleus)

        return self._run(f"sampling_distribution/{top_k}/{nucleus}", distribution,
                         (logits, jnp.float32(temperature), jnp.float32(top_p or 1.0)))

    def generate(self, prompts: Any, params: Mapping[str, Any], config: GPTConfig,
                 max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, eot_token: int | None = None,
                 rng: np.random.Generator | None = None, return_logits: bool = False) -> Any:
        """Up to ``max_new_tokens`` new tokens after each prompt, the prompts decoded
        together (adapters.kit.generate_by_forward). Each step runs the model on every
        unfinished sequence's last n_ctx tokens, right-padded to n_ctx (causality: the
        padding cannot reach the rows before it, and one compilation serves every step),
        and draws from that row's ``sampling_distribution`` with one uniform of ``rng``
        per token, in the order step by step, then sequence by sequence."""
        top_k = _as_int(top_k)
        weights: dict[str, Any] = {}  # converted at the first step, once the inputs are checked

        def last_rows(contexts: list[list[int]]) -> jax.Array:
            if not weights:
                weights.update(self._in(dict(params)))
            window = np.zeros((len(contexts), config.n_ctx), dtype=np.int32)
            for row, context in enumerate(contexts):
                window[row, : len(context)] = context
            all_logits = self._run("gpt_forward", ops.gpt_forward,
                                   (jax.device_put(window, self._cpu), weights, config))
            last = jnp.asarray([len(c) - 1 for c in contexts])
            return all_logits[jnp.arange(len(contexts)), last]  # (B, V) in the dtype

        return generate_by_forward(last_rows, prompts, params, config, max_new_tokens,
                                   temperature=temperature, top_k=top_k, top_p=top_p,
                                   eot_token=eot_token, rng=rng, return_logits=return_logits,
                                   distribution=self._distribution)


# --- pure functions the backend jit-compiles ---------------------------------------------------


def _loss_and_grads(tokens: jax.Array, targets: jax.Array, params: dict, config: GPTConfig
                    ) -> tuple[jax.Array, dict]:
    def loss(p: dict) -> jax.Array:
        log_p = ops.log_softmax_wide(ops.gpt_forward(tokens, p, config))
        return -jnp.mean(jnp.take_along_axis(log_p, targets[..., None], axis=-1))

    return jax.value_and_grad(loss)(params)


def _adamw_step(theta: dict, g: dict, m: dict, v: dict, lr: jax.Array, t: jax.Array,
                beta1: float, beta2: float, eps: float, weight_decay: float
                ) -> tuple[dict, dict, dict]:
    """One AdamW step, t = 1, 2, … (Loshchilov & Hutter, Algorithm 2; decoupled decay)."""
    new_theta, new_m, new_v = {}, {}, {}
    for k, th in theta.items():
        acc = ops.accumulation_dtype(th.dtype)
        thw, gw = th.astype(acc), g[k].astype(acc)
        mw = beta1 * m[k].astype(acc) + (1.0 - beta1) * gw
        vw = beta2 * v[k].astype(acc) + (1.0 - beta2) * gw * gw
        m_hat = mw / (1.0 - beta1 ** t)
        v_hat = vw / (1.0 - beta2 ** t)
        update = m_hat / (jnp.sqrt(v_hat) + eps) + weight_decay * thw
        new_theta[k] = (thw - lr * update).astype(th.dtype)
        new_m[k], new_v[k] = mw.astype(th.dtype), vw.astype(th.dtype)
    return new_theta, new_m, new_v


def _clip(grads: dict, max_norm: jax.Array, eps: float = 1e-6) -> tuple[dict, jax.Array]:
    wide = {k: g.astype(ops.accumulation_dtype(g.dtype)) for k, g in grads.items()}
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in wide.values()))
    scale = jnp.minimum(1.0, max_norm / (norm + eps))
    return {k: (g * scale).astype(grads[k].dtype) for k, g in wide.items()}, norm


# --- arguments --------------------------------------------------------------------------------


def _as_int(k: Any) -> int | None:
    return int(k) if isinstance(k, np.integer) else k
