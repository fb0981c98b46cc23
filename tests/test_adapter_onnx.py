"""The ONNX Runtime adapter (gptspec.adapters.onnx): its graphs are valid ONNX, its logits
are the model's within the suite's own budget, it refuses bad input in one line, it
passes a subset of the suite in float32, float16 and bfloat16, and it needs no torch."""

from __future__ import annotations

import subprocess
import sys
from fnmatch import fnmatch

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gptspec import reference as ref
from gptspec.adapters.onnx import OnnxRuntimeBackend, ops
from gptspec.adapters.onnx.backend import model_graph
from gptspec.adapters.onnx.graph import IR_VERSION, OPSET
from gptspec.conformance import budgets as B
from gptspec.conformance.discovery import load_backend, registered
from gptspec.conformance.runner import run_suite
from gptspec.spec.config import GPTConfig
from gptspec.spec.parameters import parameter_schema

BASE = GPTConfig(vocab_size=11, n_ctx=6, d_model=8, n_layers=2, n_heads=2, d_ff=16)
# every structure the spec's configuration allows, one axis changed at a time
VARIANTS = {
    "gpt2": BASE,
    "post-ln, relu, no final norm": BASE.replace(norm="post", ffn="relu", final_norm=False),
    "guide": BASE.replace(norm="guide", ffn="guide_product", d_ff=8, tied_embeddings=False,
                          output_bias=True, final_norm=False),
    "exact gelu, untied without bias": BASE.replace(ffn="gelu", tied_embeddings=False),
    "no biases": BASE.replace(bias=False, n_heads=1, ln_eps=1e-3),
}


def small_params(config: GPTConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {s.name: (1.0 + 0.1 * rng.normal(size=s.shape)) if s.init == "ones"
            else rng.normal(0.0, 0.3, s.shape) for s in parameter_schema(config)}


def statuses(backend, *patterns: str) -> dict:
    suite = run_suite(backend, profile="quick", area=None,
                      select=lambda c: any(fnmatch(c.id, p) for p in patterns))
    return {r.id: r for r in suite.results}


def test_registered_under_onnxruntime_and_refuses_other_dtypes_and_devices():
    assert registered()["onnxruntime"] == "gptspec.adapters.onnx:OnnxRuntimeBackend"
    with pytest.raises(Exception, match="computes in float32, float16, bfloat16, not 'float64'"):
        load_backend("onnxruntime", dtype="float64")
    with pytest.raises(ValueError, match="CPU only, not on 'cuda'"):
        OnnxRuntimeBackend(device="cuda")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_model_graph_is_valid_onnx(variant, dtype):
    """onnx.checker with full_check (ONNX's own shape and type inference over the graph)."""
    model = model_graph(VARIANTS[variant], dtype)
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == OPSET and model.ir_version == IR_VERSION
    # the weights are graph inputs (one session serves every parameter set), not constants
    inputs = {i.name for i in model.graph.input}
    assert inputs == {"tokens"} | {s.name for s in parameter_schema(VARIANTS[variant])}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_forward_is_the_model_within_the_suites_budget(variant, dtype):
    """The logits against the float64 reference on the same rounded parameters, within
    the budget the suite derives for the whole model (budgets.gpt_forward_bound)."""
    config = VARIANTS[variant]
    backend = OnnxRuntimeBackend(dtype=dtype)
    params = {k: B.round_to(v, dtype) for k, v in small_params(config).items()}
    tokens = np.array([[1, 2, 3, 4, 0, 10], [5, 6, 7, 8, 9, 9]])
    got = backend.forward(tokens, params, config)
    assert got.shape == (2, 6, config.vocab_size) and got.dtype == np.float32
    bound = B.gpt_forward_bound(tokens, params, config, B.Precision.of(dtype))
    result = B.compare(got, ref.gpt_forward(tokens, params, config), B.budget(bound))
    assert result.passed, result


def test_one_session_serves_every_size_of_a_structure():
    """Sizes are dynamic dimensions: a second configuration of the same structure (other
    vocabulary, widths, context) and new weights reuse the first session."""
    backend = OnnxRuntimeBackend()
    other = BASE.replace(vocab_size=23, d_model=12, d_ff=7, n_ctx=9)
    for config, seed in ((BASE, 0), (BASE, 1), (other, 2)):
        params = small_params(config, seed)
        tokens = np.array([[0, 3, 5]])
        got = backend.forward(tokens, params, config)
        bound = B.gpt_forward_bound(tokens, params, config, B.Precision.of("float32"))
        assert B.compare(got, ref.gpt_forward(tokens, params, config), B.budget(bound)).passed
    assert sum(key[0] == "gpt_forward" for key in backend._sessions) == 1


def test_bad_input_is_refused_in_one_line():
    backend = OnnxRuntimeBackend()
    params = small_params(BASE)
    for tokens, message in ((np.array([[0, 11]]), r"token ids must lie in \[0, 11\)"),
                            (np.array([[-1]]), r"token ids must lie in \[0, 11\)"),
                            (np.zeros((1, 7), dtype=np.int64), "exceeds n_ctx=6"),
                            (np.array([[0.5]]), "token ids must be integers")):
        with pytest.raises(ValueError, match=message) as err:
            backend.forward(tokens, params, BASE)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="linear: ONNX Runtime refused the input: .*MatMul") as err:
        backend.linear(np.ones((2, 3)), np.ones((4, 5)))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="top-k must be a positive integer"):
        backend.sampling_distribution(np.zeros(4), 1.0, top_k=0)
    with pytest.raises(ValueError, match="needs an explicit seeded rng"):
        backend.generate([[1]], params, BASE, 2, temperature=1.0)


def test_every_configuration_is_supported():
    """The graphs express every structure of the spec, so nothing is declared not
    applicable (a refusal would hide a configuration from the suite)."""
    backend = OnnxRuntimeBackend()
    assert all(backend.supports(c) is None for c in VARIANTS.values())
    assert set(backend.implemented_ops()) == set(ops.__all__) - {"gpt_forward"}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_passes_a_subset_of_the_suite(dtype):
    subset = ("softmax.differential", "layer_norm.differential", "gelu_tanh.differential",
              "multi_head_attention_head_sum.differential", "block_guide.differential",
              "sequence_log_probability.differential", "gpt_forward.differential",
              "generate.greedy_reference", "sampling_distribution.differential",
              "sample_token.support")
    results = statuses(OnnxRuntimeBackend(dtype=dtype), *subset)
    assert set(results) == set(subset)
    assert {i: r.detail for i, r in results.items() if r.status != "pass"} == {}


def test_a_planted_bug_is_localised_to_its_operation():
    """Each operation is its own graph: a softmax without its max shift fails softmax's
    check, and the checks built on softmax are blocked by it."""
    class NoShift(OnnxRuntimeBackend):
        def softmax(self, z, axis=-1):
            with np.errstate(over="ignore", invalid="ignore"):
                e = np.exp(np.asarray(z, dtype=np.float32))
                return e / e.sum(axis=axis, keepdims=True)

    results = statuses(NoShift(), "softmax.differential", "attention_weights.differential")
    assert results["softmax.differential"].status == "fail"
    assert results["attention_weights.differential"].status == "blocked"


def test_onnxruntime_reduce_sum_of_an_empty_tensor():
    """The engine behaviour the adapter works around in sequence_log_probability (an
    explicit zero term): ONNX Runtime's ReduceSum returns an empty input unreduced, where
    ONNX's definition (and its reference evaluator) gives 0. When this test fails, ONNX
    Runtime has changed and the workaround can go."""
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)
    graph = helper.make_graph(
        [node], "empty_sum", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(np.array([-2, -1], dtype=np.int64), "axes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    x = np.zeros((0, 1), dtype=np.float32)
    from onnx.reference import ReferenceEvaluator

    assert ReferenceEvaluator(model).run(None, {"x": x})[0] == 0.0
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": x})[0].shape == (0, 1)


def test_the_adapter_imports_no_torch():
    """With torch made unimportable, the adapter still loads and runs a forward."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np\n"
        "from gptspec.conformance.discovery import load_backend\n"
        "from gptspec.spec.config import GPTConfig\n"
        "from gptspec.spec.parameters import parameter_schema\n"
        "c = GPTConfig(vocab_size=5, n_ctx=4, d_model=4, n_layers=1, n_heads=2, d_ff=8)\n"
        "p = {s.name: np.full(s.shape, 0.1) for s in parameter_schema(c)}\n"
        "b = load_backend('onnxruntime', dtype='float16')\n"
        "print(b.forward(np.array([[1, 2, 3]]), p, c).shape)\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("(1, 3, 5)")
