"""transformers' GPT-2 exported to ONNX by torch.onnx and run by ONNX Runtime (``hf-onnx``).

The model is transformers' ``GPT2LMHeadModel``, exported by ``torch.onnx.export`` (the
TorchScript exporter, ``dynamo=False``; the dynamo one needs onnxscript) and run by ONNX
Runtime's CPUExecutionProvider; not optimum. Logits only: ``forward`` and ``supports``.
Exporting costs seconds and the suite draws new weights for most examples, so each
configuration is exported once (batch and sequence length dynamic) and each set of weights
is written into the graph's initializers before its session is built; with graph
optimisations on, ``SessionOptions.add_initializer`` left some exported values in use.
GPT-2's eager attention: the SDPA export's 16-bit graphs do not load in ONNX Runtime.
float32 and float16; bfloat16 is declined (the CPU provider has no bfloat16 Add)."""

from __future__ import annotations

import hashlib
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gptspec.adapters.inputs import check_tokens
from gptspec.conformance.protocol import NotApplicable
from gptspec.fast import hf_interop
from gptspec.spec.config import GPTConfig
from gptspec.spec.parameters import check_parameters, parameter_schema

DTYPES = ("float32", "float16")
PREFIX = "model."  # the exported initializers' names: the wrapper's attribute, then HF's


@dataclass(frozen=True)
class Export:
    """One configuration's exported graph and, per initializer, the schema parameter it
    holds (``transposed``: lm_head.weight, which is w_uᵀ)."""

    graph: Any  # onnx.ModelProto, its initializers rewritten for each set of weights
    initializers: tuple[tuple[str, str, bool], ...]  # (initializer, schema name, transposed)


class TransformersOnnxBackend:
    """transformers' GPT2LMHeadModel exported by torch.onnx, run by ONNX Runtime on the CPU."""

    protocol_version = 2  # gptspec.conformance.protocol: forward(tokens, params, config)
    name = "hf-onnx"
    OPSET = 17
    KEEP_EXPORTS = 8
    KEEP_SESSIONS = 4

    def __init__(self, device: str = "cpu", dtype: str = "float32") -> None:
        if dtype not in DTYPES:
            # declined, not broken: the run is recorded as refused, with this reason
            raise NotApplicable(f"transformers' GPT-2 exported by torch.onnx runs in ONNX "
                                f"Runtime's CPU provider in {' and '.join(DTYPES)}, not "
                                f"{dtype!r} (it has no bfloat16 kernel for the graph's Add)")
        if device != "cpu":
            raise ValueError(f"the hf-onnx backend runs on the CPU only, not on {device!r}")
        import onnxruntime as ort
        import torch
        import transformers

        self.dtype, self.device = dtype, device
        self.np_dtype = np.dtype(dtype)
        self.version = (f"transformers {transformers.__version__}, exported by torch.onnx "
                        f"(torch {torch.__version__}, TorchScript exporter, opset "
                        f"{self.OPSET}), onnxruntime {ort.__version__} (CPUExecutionProvider)")
        self._exports: OrderedDict[GPTConfig, Export] = OrderedDict()
        self._sessions: OrderedDict[tuple[GPTConfig, bytes], Any] = OrderedDict()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device!r}, dtype={self.dtype!r})"

    supports = staticmethod(hf_interop.why_inexpressible)

    # --- export, once per configuration -------------------------------------------------------

    def export(self, config: GPTConfig) -> Export:
        """The configuration's exported graph (kept: the last ``KEEP_EXPORTS``)."""
        import torch

        exported = (self._exports.pop(config, None)
                    or _export(config, getattr(torch, self.dtype), self.OPSET))
        self._exports[config] = exported
        while len(self._exports) > self.KEEP_EXPORTS:
            self._exports.popitem(last=False)
        return exported

    def weights(self, params: Mapping[str, Any], config: GPTConfig) -> dict[str, np.ndarray]:
        """The exported graph's initializers holding ``params``, rounded once to the dtype."""
        out = {}
        for initializer, name, transposed in self.export(config).initializers:
            value = np.asarray(params[name], dtype=np.float64).astype(self.np_dtype)
            out[initializer] = np.ascontiguousarray(value.T if transposed else value)
        return out

    def session(self, params: Mapping[str, Any], config: GPTConfig) -> Any:
        """An ONNX Runtime session of the exported graph with ``params`` written into its
        initializers; the last few are kept by configuration and weights (the suite calls
        forward several times with one set of weights)."""
        import onnxruntime as ort
        from onnx import numpy_helper

        weights = self.weights(params, config)
        digest = hashlib.blake2b(digest_size=16)
        for name in sorted(weights):
            digest.update(name.encode())
            digest.update(weights[name].tobytes())
        key = (config, digest.digest())
        session = self._sessions.pop(key, None)
        if session is None:
            graph = self.export(config).graph
            for init in graph.graph.initializer:
                init.CopyFrom(numpy_helper.from_array(weights[init.name], init.name))
            options = ort.SessionOptions()
            options.log_severity_level = 3
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            session = ort.InferenceSession(graph.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
        self._sessions[key] = session
        while len(self._sessions) > self.KEEP_SESSIONS:
            self._sessions.popitem(last=False)
        return session

    # --- the protocol ----------------------------------------------------------------------

    def forward(self, tokens: Any, params: Mapping[str, Any], config: GPTConfig) -> np.ndarray:
        reason = self.supports(config)
        if reason:
            raise NotApplicable(reason)
        tokens = np.asarray(tokens)
        check_tokens(tokens, config)
        check_parameters(dict(params), config)
        ids = tokens.reshape(-1, tokens.shape[-1]).astype(np.int64)
        (logits,) = self.session(params, config).run(["logits"], {"input_ids": ids})
        # float16 logits widened to float32, exactly
        return np.asarray(logits, np.float32).reshape(*tokens.shape, config.vocab_size)


def _export(config: GPTConfig, dtype: Any, opset: int) -> Export:
    """transformers' GPT2LMHeadModel of ``config`` in the torch ``dtype``, exported by
    torch.onnx.export with the batch and the sequence length dynamic. While it is exported
    each parameter holds a value of its own (no two initializers are merged), and constant
    folding is off, so that each initializer is one parameter as GPT-2 stores it."""
    import onnx
    import torch
    import transformers

    model = transformers.GPT2LMHeadModel(hf_interop.config_to_hf(config)).eval()
    model.set_attn_implementation("eager")
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.fill_(float(i + 1))  # exact in float16 too
    model = model.to(dtype)

    class Logits(torch.nn.Module):
        """input_ids → logits. The all-ones attention mask spares transformers' check for
        packed sequences (torch.diff, which the exporter cannot export)."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                              use_cache=False).logits

    example = torch.zeros((2, min(2, config.n_ctx)), dtype=torch.long)
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        path = f"{folder}/gpt2.onnx"
        torch.onnx.export(Logits(), (example,), path, dynamo=False, opset_version=opset,
                          input_names=["input_ids"], output_names=["logits"],
                          dynamic_axes={"input_ids": {0: "B", 1: "T"},
                                        "logits": {0: "B", 1: "T"}},
                          do_constant_folding=False)
        proto = onnx.load(path)
    by_hf = {hf_interop.hf_name(s.name): s.name for s in parameter_schema(config)}
    initializers, bound = [], set()
    for init in proto.graph.initializer:
        hf = init.name.removeprefix(PREFIX)
        if hf not in by_hf:
            raise RuntimeError(f"the exported graph's initializer {init.name!r} is no "
                               f"parameter of GPT-2 (torch.onnx merged or renamed one)")
        initializers.append((init.name, by_hf[hf], hf == "lm_head.weight"))
        bound.add(by_hf[hf])
    missing = set(by_hf.values()) - bound  # tied: lm_head is wte, no initializer of its own
    if missing:
        raise RuntimeError(f"the exported graph holds no initializer for {sorted(missing)}")
    return Export(proto, tuple(initializers))


__all__ = ["TransformersOnnxBackend"]
