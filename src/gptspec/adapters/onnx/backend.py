"""The ONNX graphs under the conformance protocol: ``OnnxRuntimeBackend(device="cpu",
dtype=...)``, run by ONNX Runtime's CPU execution provider.

``forward`` runs the model's graph; every other function of
:mod:`gptspec.adapters.onnx.ops` is exposed under its reference name as a graph of that
one operation (inputs rounded to the dtype on the way in; 16-bit results widened to
float32, exactly). ``generate`` decodes by repeated ``forward`` (no KV cache), drawing each
token from the ``sampling_distribution`` graph on the host. Building a session costs far
more than running one, and the suite calls ``forward`` with hundreds of parameter sets,
so weights are graph inputs and every size a dynamic dimension: a graph depends only on
the configuration's structure, and one session is kept per structure (and operation).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

import gptspec
from gptspec.adapters.inputs import check_ids, check_tokens
from gptspec.adapters.kit import OptionalOperations, generate_by_forward
from gptspec.adapters.onnx import ops, sampling
from gptspec.adapters.onnx.graph import ELEM_TYPES, FLOAT, INT64, NUMPY_TYPES, OPSET, Graph
from gptspec.conformance.protocol import NotApplicable
from gptspec.reference.sampling import check_sampling_settings
from gptspec.spec.config import GPTConfig
from gptspec.spec.parameters import check_parameters, parameter_schema


class OnnxRuntimeBackend(OptionalOperations):
    """The decoder-only GPT as ONNX graphs written from the spec's equations, run by ONNX
    Runtime on the CPU, in float32 or a 16-bit dtype (float16, bfloat16: 16-bit storage,
    float32 arithmetic)."""

    name = "onnxruntime"
    protocol_version = 2
    OPERATIONS = tuple(ops.__all__)  # every optional operation ops writes (adapters.kit)
    KEEP_SESSIONS = 64

    def __init__(self, device: str = "cpu", dtype: str = "float32") -> None:
        if dtype not in ELEM_TYPES:
            # declined, not broken: the run is recorded as refused, with this reason
            raise NotApplicable(f"the ONNX Runtime backend computes in "
                                f"{', '.join(ELEM_TYPES)}, not {dtype!r}")
        if device != "cpu":
            raise ValueError(f"the ONNX Runtime backend runs on the CPU only, not on {device!r}")
        self.dtype, self.device = dtype, device
        self.np_dtype = NUMPY_TYPES[dtype]
        self.version = (f"gptspec {gptspec.__version__}, onnxruntime {ort.__version__} "
                        f"(CPUExecutionProvider), onnx {onnx.__version__}, opset {OPSET}")
        self._sessions: OrderedDict[Any, ort.InferenceSession] = OrderedDict()

    def __repr__(self) -> str:
        return f"OnnxRuntimeBackend(device={self.device!r}, dtype={self.dtype!r})"

    # --- sessions ------------------------------------------------------------------------

    def _session(self, key: Any, build: Callable[[], onnx.ModelProto]) -> ort.InferenceSession:
        """The session for ``key``, built from ``build()`` the first time; the most recent
        ``KEEP_SESSIONS`` are kept."""
        session = self._sessions.pop(key, None)
        if session is None:
            options = ort.SessionOptions()
            options.log_severity_level = 4  # fatal only: an error comes back as a ValueError (_run)
            # no busy-waiting worker threads between the suite's many small calls
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            session = ort.InferenceSession(build().SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
        self._sessions[key] = session
        while len(self._sessions) > self.KEEP_SESSIONS:
            self._sessions.popitem(last=False)
        return session

    def graph(self) -> Graph:
        return Graph(self.dtype)

    def _feed(self, value: Any) -> np.ndarray:
        """A NumPy input: floats rounded once to the backend's dtype, integers as int64."""
        array = np.asarray(value)
        if array.dtype.kind in "iu":
            return array.astype(np.int64)
        return array.astype(self.np_dtype)

    @staticmethod
    def _out(value: np.ndarray) -> np.ndarray:
        return value.astype(np.float32) if value.dtype == np.float16 else value

    # --- the operations ------------------------------------------------------------------

    def _operation(self, name: str) -> Callable[..., Any]:
        emit = getattr(ops, name)
        # the reference's signature: the emitter's without its leading graph
        params = list(inspect.signature(emit).parameters.values())[1:]
        signature = inspect.Signature(params)

        def op(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            values = list(bound.arguments.values())
            if name in ("one_hot", "token_embedding"):
                vocab = values[1] if name == "one_hot" else np.shape(values[1])[0]
                check_ids(np.asarray(values[0]), vocab)
            return self._run_op(name, emit, values)

        op.__name__ = op.__qualname__ = name
        op.__doc__ = emit.__doc__
        return op

    def _run_op(self, name: str, emit: Callable[..., Any], values: list[Any]) -> Any:
        """One operation's graph: arrays (and dicts of arrays) become graph inputs, the
        other arguments are fixed in the graph and in its session's key."""
        feeds: dict[str, np.ndarray] = {}
        layout: list[Any] = []  # per argument: how it enters the graph
        for i, value in enumerate(values):
            if isinstance(value, np.generic):  # a NumPy scalar (T, n_heads, ε): fixed
                value = value.item()
            if isinstance(value, Mapping):
                arrays = {k: self._feed(v) for k, v in value.items()}
                feeds.update({f"a{i}.{k}": a for k, a in arrays.items()})
                layout.append(("dict", tuple(sorted((k, a.ndim, a.dtype.kind)
                                                    for k, a in arrays.items()))))
            elif isinstance(value, np.ndarray):
                array = self._feed(value)
                feeds[f"a{i}"] = array
                layout.append(("array", array.ndim, array.dtype.kind))
            else:
                layout.append(("fixed", value))

        def build() -> onnx.ModelProto:
            g = self.graph()
            args: list[Any] = []
            for i, how in enumerate(layout):
                if how[0] == "dict":
                    args.append({k: g.input(f"a{i}.{k}", _elem(g, kind), rank)
                                 for k, rank, kind in how[1]})
                elif how[0] == "array":
                    args.append(g.input(f"a{i}", _elem(g, how[2]), how[1]))
                else:
                    args.append(how[1])
            result = emit(g, *args)
            for out in result if isinstance(result, tuple) else (result,):
                g.output(out, _out_type(g, name))
            return g.model(name)

        session = self._session((name, tuple(layout)), build)
        outputs = [self._out(o) for o in _run(session, feeds, name)]
        return tuple(outputs) if len(outputs) > 1 else outputs[0]

    # --- the whole model -----------------------------------------------------------------

    @staticmethod
    def supports(config: GPTConfig) -> str | None:
        """None: every configuration of the spec has its graph (each norm placement, FFN,
        tied or untied output with or without bias, biases on or off, final norm or not)."""
        return None

    def forward(self, tokens: Any, params: Mapping[str, Any], config: GPTConfig) -> np.ndarray:
        tokens = np.asarray(tokens)
        check_tokens(tokens, config)
        check_parameters(dict(params), config)
        # one graph per structure: the sizes are dynamic, so the key leaves them out
        structure = (config.n_layers, config.n_heads, config.norm, config.ffn,
                     config.tied_embeddings, config.attn_bias, config.ffn_bias,
                     config.output_bias, config.positional_embedding, config.final_norm,
                     config.ln_eps)
        names = sorted(params)
        session = self._session(("gpt_forward", structure, tuple(names)),
                                lambda: model_graph(config, self.dtype))
        feeds = {k: self._feed(params[k]) for k in names}
        # any leading axes fold into one batch axis and come back after
        feeds["tokens"] = tokens.reshape(-1, tokens.shape[-1]).astype(np.int64)
        (logits,) = _run(session, feeds, "gpt_forward")
        return self._out(logits).reshape(*tokens.shape, -1)

    # --- generation --------------------------------------------------------------------

    def sampling_distribution(self, z: Any, temperature: float = 1.0, top_k: int | None = None,
                              top_p: float | None = None) -> np.ndarray:
        """The distribution a token is drawn from (:mod:`gptspec.adapters.onnx.sampling`),
        computed by its graph in float32 from logits in the backend's dtype."""
        top_k = int(top_k) if isinstance(top_k, np.integer) else top_k
        check_sampling_settings(temperature, top_k, top_p)
        logits = self._feed(np.asarray(z, dtype=np.float64))
        if temperature == 0:
            def build_greedy() -> onnx.ModelProto:
                g = self.graph()
                g.output(sampling.greedy(g, g.wide(g.input("z", g.store_type, logits.ndim))),
                         FLOAT)
                return g.model("greedy")

            session = self._session(("greedy", logits.ndim), build_greedy)
            return _run(session, {"z": logits}, "greedy")[0]
        with_k, with_p = top_k is not None, top_p is not None and top_p < 1
        feeds = {"z": logits, "temperature": np.asarray(temperature, dtype=np.float32)}
        if top_k is not None:  # TopK needs k ≤ the row length; a larger k keeps every token
            feeds["k"] = np.array([min(top_k, logits.shape[-1])], dtype=np.int64)
        if with_p:
            feeds["p"] = np.asarray(top_p, dtype=np.float32)

        def build() -> onnx.ModelProto:
            g = self.graph()
            q = sampling.sampling_distribution(
                g, g.input("z", g.store_type, logits.ndim), g.input("temperature", FLOAT, 0),
                g.input("k", INT64, 1) if with_k else None,
                g.input("p", FLOAT, 0) if with_p else None)
            g.output(q, FLOAT)
            return g.model("sampling_distribution")

        session = self._session(("sampling_distribution", logits.ndim, with_k, with_p), build)
        return _run(session, feeds, "sampling_distribution")[0]

    def generate(self, prompts: Any, params: Mapping[str, Any], config: GPTConfig,
                 max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, eot_token: int | None = None,
                 rng: np.random.Generator | None = None, return_logits: bool = False) -> Any:
        """Up to ``max_new_tokens`` new tokens after each prompt, by repeated ``forward``:
        each step runs the model graph on every unfinished sequence's last n_ctx tokens (no
        cache: the graph is the forward pass and nothing else) and draws from the last
        row's ``sampling_distribution`` (its graph) by the spec's sample_token, one
        uniform of ``rng`` per token, step by step, then sequence by sequence."""
        def last_rows(contexts: list[list[int]]) -> np.ndarray:
            return np.stack([self.forward(np.asarray([c], dtype=np.int64), params,
                                          config)[0, -1] for c in contexts])

        def distribution(rows: np.ndarray, tau: float, k: int | None,
                         p: float | None) -> np.ndarray:
            return np.stack([self.sampling_distribution(row, tau, k, p) for row in rows])

        return generate_by_forward(last_rows, prompts, params, config, max_new_tokens,
                                   temperature=temperature, top_k=top_k, top_p=top_p,
                                   eot_token=eot_token, rng=rng, return_logits=return_logits,
                                   distribution=distribution)


def model_graph(config: GPTConfig, dtype: str = "float32") -> onnx.ModelProto:
    """The whole model's ONNX graph for ``config``'s structure: inputs ``tokens`` (int64,
    (B, T)) and every parameter of the schema under its own name, stored in ``dtype``;
    output the logits (B, T, V). Every size is a dynamic dimension."""
    g = Graph(dtype)
    ids = g.input("tokens", INT64, 2)
    weights = {s.name: g.input(s.name, g.store_type, len(s.shape))
               for s in parameter_schema(config)}
    g.output(ops.gpt_forward(g, ids, weights, config))
    return g.model("gpt_forward")


# --- helpers ------------------------------------------------------------------------------------


def _elem(g: Graph, kind: str) -> int:
    """A graph input's element type from its NumPy kind: ids int64, floats stored."""
    return INT64 if kind in "iu" else g.store_type


def _out_type(g: Graph, op_name: str) -> int:
    """The element type of an operation's output: the stored dtype, except the log
    probability, which stays in float32 (the accumulation dtype)."""
    return FLOAT if op_name == "sequence_log_probability" else g.store_type


def _run(session: ort.InferenceSession, feeds: dict[str, np.ndarray], what: str) -> list:
    """``session.run``, with ONNX Runtime's refusal of an input (shapes that do not fit
    together, say) as a one-line ValueError naming the operation."""
    try:
        return session.run(None, feeds)
    except Exception as err:  # onnxruntime's Fail, InvalidArgument, RuntimeException …
        if type(err).__module__.startswith("onnxruntime"):
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(f"{what}: ONNX Runtime refused the input: {first}") from None
        raise
