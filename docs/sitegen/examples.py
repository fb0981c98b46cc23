"""A worked example for an entry's page: small concrete inputs, the call of the reference
function, and what it printed, made at build time by running that very code.

Array inputs follow the entry's ``sympy_inputs`` (the shapes the tests use, at small
sizes), passed by position as the tests pass them and named after the reference function's
parameters. Entries whose inputs are not arrays (text, merges, a configuration and its
parameters) take the inputs chosen in ``CHOSEN`` below. An example whose code does not run
is left out (and the docs tests require the ones they name to be there).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

SIZES = {"T": 3, "n_ctx": 4, "d_model": 4, "d": 4, "h": 2, "d_k": 2, "k": 2, "d_ff": 6,
         "f": 6, "V": 5, "n": 4, "m": 3}
POSITIVE = {"eps": "1e-5", "tau": "0.8"}  # scalar inputs given a value a reader recognises


# Inputs chosen by hand where the sympy form has no array inputs: setup lines, the call's
# arguments, and what to print of the result (the whole result if None).
TINY = ("from gptspec.spec import GPTConfig, init_parameters",
        "config = GPTConfig(vocab_size=5, n_ctx=4, d_model=4, n_layers=1, n_heads=2, d_ff=8)",
        "params = init_parameters(config, seed=0, std=0.5)")
BLOCK = TINY + ("from gptspec.reference.block import block_parameters",
                "H = np.array([[0.3, -0.5, -0.9, -1.0], [0.6, 0.8, 0.2, 0.5]])")
MERGES = ("merges = [(108, 111), (256, 119)]  # 'l' 'o' → 256, then 256 'w' → 257",)
LOGITS = ("z = np.array([0.1, 2.0, -1.0, 2.0, 0.5])",)
CE = ("logits = np.array([[2.0, 0.5, -1.0], [0.0, 0.0, 3.0]])",
      "targets = np.array([0, 2])  # the token that follows each position")


def _guide(cfg: str) -> tuple[str, ...]:
    return tuple(line.replace("d_ff=8)", cfg) for line in BLOCK)


CHOSEN: dict[str, tuple[tuple[str, ...], str, str | None]] = {
    "byte_tokens": ((), "", "result[65:68]"),
    "pretokenize": ((), '"Hello world, it\'s 2025!"', None),
    "pair_counts": ((), "{(1, 2, 3): 2, (2, 3): 1}", None),
    "best_pair": ((), "{(1, 2): 3, (2, 3): 3, (3, 4): 1}", None),
    "merge_pair": ((), "[1, 2, 3, 1, 2], (1, 2), 256", None),
    "train": ((), '"low lower lowest", 259', None),
    "token_bytes": (MERGES, "merges", "result[256:]"),
    "bpe_chunk": (MERGES, 'b"lower", merges', None),
    "split_special": ((), '"hi<|endoftext|>there", {"<|endoftext|>": 50256}, "all"', None),
    "encode": (MERGES, '"lower low", merges', None),
    "decode": (MERGES, "[257, 101, 114], merges", None),
    "bytes_to_unicode": ((), "", "{b: result[b] for b in (32, 65, 255)}"),
    "block_pre_ln": (BLOCK, "H, block_parameters(params, 0), config", None),
    "block_post_ln": (tuple(line.replace("d_ff=8)", 'd_ff=8, norm="post")') for line in BLOCK),
                      "H, block_parameters(params, 0), config", None),
    "block_guide": (_guide('d_ff=4, norm="guide", ffn="guide_product")'),
                    "H, block_parameters(params, 0), config", None),
    "gpt_forward": (TINY, "np.array([1, 4, 2]), params, config", None),
    "block_pre_ln_backward": (BLOCK + ("dY = np.ones_like(H)",),
                              "dY, H, block_parameters(params, 0), config", "result[0]"),
    "block_post_ln_backward": (tuple(line.replace("d_ff=8)", 'd_ff=8, norm="post")')
                                     for line in BLOCK) + ("dY = np.ones_like(H)",),
                               "dY, H, block_parameters(params, 0), config", "result[0]"),
    "block_guide_backward": (_guide('d_ff=4, norm="guide", ffn="guide_product")')
                             + ("dY = np.ones_like(H)",),
                             "dY, H, block_parameters(params, 0), config", "result[0]"),
    "train_loop": (TINY + ("from gptspec.reference.training import TrainLoopSettings",
                           "tokens = np.array([1, 4, 2, 0, 3, 1, 2, 4, 0, 3, 2, 1])",
                           "settings = TrainLoopSettings(max_steps=3, batch_size=2, "
                           "warmup_steps=1, seed=0)"),
                   "tokens, params, config, settings", "[round(loss, 6) for loss in result[0]]"),
    "gpt_backward": (TINY, "np.array([1, 4, 2]), np.array([4, 2, 0]), params, config",
                     'result[0], result[1]["wte"]'),
    "adamw_step": (("theta = np.array([1.0, -2.0])", "g = np.array([0.5, 0.5])",
                    "m = np.zeros(2)", "v = np.zeros(2)"),
                   "theta, g, m, v, 1, 0.1, weight_decay=0.1", None),
    "clip_grad_norm": ((), '{"w": np.array([3.0, 4.0])}, 1.0', None),
    "lr_schedule": ((), "", None),
    "greedy_token": (LOGITS, "z", None),
    "top_k_filter": (LOGITS, "z, 2", None),
    "nucleus_filter": (LOGITS, "z, 0.9", None),
    "sampling_distribution": (LOGITS, "z, temperature=0.8, top_k=3", None),
    "sample_token": (("q = np.array([0.1, 0.6, 0.3])",), "q, np.random.default_rng(0)", None),
    "crop_context": ((), "[1, 2, 3, 4, 5, 6], 4", None),
    "stop_condition": ((), "50256, 3, 10, eot_token=50256", None),
    "generate": (TINY, "[[1, 4]], params, config, 3, temperature=0.0", None),
    # the loss entries take the targets as token ids, not one-hot rows
    "cross_entropy_sum": (CE, "logits, targets", None),
    "cross_entropy_mean": (CE, "logits, targets", None),
    "cross_entropy_gradient": (CE, "logits, targets", None),
    "token_embedding_backward": (("dE = np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])",),
                                 "dE, np.array([2, 0, 2]), 4", None),
    "positional_embedding_backward": (("dP = np.array([[0.1, 0.2], [0.3, 0.4]])",), "dP, 4",
                                      None),
    "tied_embedding_accumulation": (("dW_embed = np.array([[1.0, 0.0], [0.0, 2.0]])",
                                     "dW_unembed = np.array([[0.5, 0.5], [0.5, 0.5]])"),
                                    "dW_embed, dW_unembed", None),
    "layer_norm_backward": (("x = np.array([[0.3, -0.5, -0.9, -1.0], [0.6, 0.8, 0.2, 0.5]])",
                             "gamma = np.array([1.0, 0.5, -0.5, 2.0])",
                             "dY = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, -1.0]])"),
                            "dY, x, gamma, 1e-5", None),
    "multi_head_attention_backward": (BLOCK + ("p = block_parameters(params, 0)",
                                               "dY = np.ones_like(H)"),
                                      'dY, H, p["attn.w_qkv"], p["attn.b_qkv"], p["attn.w_o"], '
                                      'p["attn.b_o"], 2', "result[0]"),
}
COSTS_SETUP = ("from gptspec.spec import PRESETS",)
# the learning rate at a few steps: warm-up to 6e-4 over 100 steps, cosine to 6e-5 at 1000
LR_CALL = "[reference.lr_schedule(s, 6e-4, 6e-5, 100, 1000) for s in (0, 50, 100, 550, 1000)]"


@dataclass(frozen=True)
class Example:
    code: str  # a complete script: imports, inputs, one call, print
    output: str  # what the script printed when the site was built


def _size(expr: str) -> int:
    expr = expr.strip()
    for name in sorted(SIZES, key=len, reverse=True):
        expr = re.sub(rf"\b{name}\b", str(SIZES[name]), expr)
    if not re.fullmatch(r"[\d\s+*-]+", expr):
        raise ValueError(expr)
    return int(eval(expr))  # noqa: S307 — digits and + - * only, checked above


def _array(values: np.ndarray, indent: int) -> str:
    """A nested list literal, one row per line, aligned under its opening bracket."""
    if values.ndim == 1:
        return "[" + ", ".join(str(int(v)) if values.dtype.kind in "iu" else repr(float(v))
                               for v in values) + "]"
    rows = [_array(v, indent + 1) for v in values]
    return "[" + (",\n" + " " * (indent + 1)).join(rows) + "]"


def _input_line(name: str, symbol: str, shape: str, rng: np.random.Generator) -> str | None:
    """One assignment of a Python variable, or None for an input this cannot make."""
    m = re.fullmatch(r"(\[[^\]]+\])?\(([^()]*)\)(.*)", shape.strip())
    if not m:
        m_int = re.fullmatch(r"int (.+)", shape.strip())
        return f"{name} = {_size(m_int.group(1))}" if m_int else None
    count, dims_text, rest = m.group(1), m.group(2), m.group(3).strip()
    if rest == "> 0" and not dims_text.strip():
        return f"{name} = {POSITIVE.get(symbol, '0.5')}"
    try:
        dims = tuple(_size(d) for d in dims_text.split(",") if d.strip())
        if count:
            dims = (_size(count.strip("[]")), *dims)
    except ValueError:
        return None
    prefix = f"{name} = np.array("
    if rest == "int < V":
        return prefix + _array(rng.integers(0, SIZES["V"], dims), len(prefix)) + ")"
    if rest == "mask" and len(dims) == 2:
        return f"{name} = np.triu(np.full({dims}, -np.inf), k=1)  # the causal mask"
    if rest:
        return None
    if symbol in ("X", "Y") and len(dims) == 2 and dims[1] == SIZES["V"]:  # one-hot rows
        ids = rng.integers(0, SIZES["V"], dims[0])
        return f"{name} = np.eye({dims[1]})[{ids.tolist()}]  # one-hot rows of tokens {ids.tolist()}"
    return prefix + _array(np.round(rng.uniform(-1, 1, dims), 1) + 0.0, len(prefix)) + ")"


def _script(entry: Any, function: Any) -> str | None:
    name = entry.reference
    if entry.id in CHOSEN or entry.group == "costs":
        setup, args, show = CHOSEN.get(entry.id, (COSTS_SETUP, 'PRESETS["gpt2"]', None))
        call = LR_CALL if entry.id == "lr_schedule" else f"reference.{name}({args})"
        lines = [*setup, "", f"result = {call}", f"print({show or 'result'})"]
    else:
        if not entry.sympy_inputs:
            return None
        params = list(inspect.signature(function).parameters)
        if len(params) < len(entry.sympy_inputs):
            return None
        names = params[:len(entry.sympy_inputs)]
        rng = np.random.default_rng(0)
        lines = []
        for param, (symbol, shape) in zip(names, entry.sympy_inputs, strict=True):
            line = _input_line(param, symbol, shape, rng)
            if line is None:
                return None
            lines.append(line)
        lines += ["", f"print(reference.{name}({', '.join(names)}))"]
    return "\n".join(["import numpy as np", "from gptspec import reference", "",
                      "np.set_printoptions(precision=4, suppress=True)", *lines]) + "\n"


def worked_example(entry: Any, reference: ModuleType) -> Example | None:
    function = getattr(reference, entry.reference or "", None)
    code = _script(entry, function) if function is not None else None
    if code is None:
        return None
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"<example {entry.id}>", "exec"), {})  # noqa: S102 — our code
    except Exception:  # noqa: BLE001 — inputs the function rejects: no example
        return None
    return Example(code, printed.getvalue())
