"""The adapters for engines written outside this project (gptspec.adapters): each imports,
refuses what its engine cannot express in one line, and passes a quick subset of the
conformance suite. The JAX adapter must not need torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from gptspec import reference as ref
from gptspec.conformance.discovery import load_backend, registered
from gptspec.conformance.protocol import NotApplicable
from gptspec.conformance.runner import run_suite
from gptspec.spec.config import GPTConfig
from gptspec.spec.parameters import parameter_schema


def small_params(config: GPTConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {s.name: (1.0 + 0.1 * rng.normal(size=s.shape)) if s.init == "ones"
            else rng.normal(0.0, 0.3, s.shape) for s in parameter_schema(config)}


GPT2_LIKE = GPTConfig(vocab_size=11, n_ctx=6, d_model=8, n_layers=2, n_heads=2, d_ff=16,
                      norm="pre", ffn="gelu_tanh", tied_embeddings=True, attn_bias=True, ffn_bias=True,
                      output_bias=False, final_norm=True, ln_eps=1e-5)
POST_LN = GPT2_LIKE.replace(norm="post")


def statuses(backend, *patterns: str, area: str | None = None, profile: str = "quick") -> dict:
    from fnmatch import fnmatch

    suite = run_suite(backend, profile=profile, area=area,
                      select=lambda c: any(fnmatch(c.id, p) for p in patterns))
    return {r.id: r for r in suite.results}


# --- JAX ------------------------------------------------------------------------------------


def test_jax_is_registered_and_refuses_what_it_cannot_run():
    assert registered()["jax"] == "gptspec.adapters.jax:JaxBackend"
    with pytest.raises(Exception, match="computes in float32, bfloat16, float16, not 'float64'"):
        load_backend("jax", dtype="float64")
    backend = load_backend("jax", dtype="float32")
    params = small_params(GPT2_LIKE)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 11\)"):
        backend.forward(np.array([[0, 11]]), params, GPT2_LIKE)
    with pytest.raises(ValueError, match="exceeds n_ctx=6"):
        backend.forward(np.zeros((1, 7), dtype=np.int64), params, GPT2_LIKE)


@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-4), ("bfloat16", 0.2)])
def test_jax_forward_is_the_model(dtype, tolerance):
    """Every variant (a post-LN, Guide and untied model too) against the reference; the
    tolerance is loose on purpose: the suite's budgets are the real test, below."""
    backend = load_backend("jax", dtype=dtype)
    for config in (GPT2_LIKE, POST_LN, GPT2_LIKE.replace(norm="guide", ffn="guide_product",
                                                        d_ff=8, tied_embeddings=False,
                                                        output_bias=True, final_norm=False)):
        params = small_params(config)
        tokens = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
        got = backend.forward(tokens, params, config)
        assert got.shape == (2, 4, config.vocab_size) and got.dtype == np.float32
        np.testing.assert_allclose(got, ref.gpt_forward(tokens, params, config),
                                   atol=tolerance, rtol=0)


def test_jax_adapter_imports_no_torch():
    """With torch made unimportable, the JAX adapter still loads and runs a forward."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np\n"
        "from gptspec.conformance.discovery import load_backend\n"
        "from gptspec.spec.config import GPTConfig\n"
        "from gptspec.spec.parameters import parameter_schema\n"
        "c = GPTConfig(vocab_size=5, n_ctx=4, d_model=4, n_layers=1, n_heads=2, d_ff=8)\n"
        "p = {s.name: np.full(s.shape, 0.1) for s in parameter_schema(c)}\n"
        "b = load_backend('jax', dtype='bfloat16')\n"
        "print(b.forward(np.array([[1, 2, 3]]), p, c).shape)\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("(1, 3, 5)")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_jax_passes_a_quick_subset(dtype):
    backend = load_backend("jax", dtype=dtype)
    subset = ("softmax.differential", "layer_norm.differential", "block_post_ln.differential",
              "gpt_forward.differential", "generate.greedy_reference",
              "sampling_distribution.differential", "adamw_step.trajectory")
    results = statuses(backend, *subset)
    assert set(results) == set(subset)
    failed = {i: r.detail for i, r in results.items() if r.status != "pass"}
    assert not failed


def test_jax_sums_a_token_embeddings_gradient_in_float32_in_bfloat16():
    """∂W_E of the row selection adds one row of the incoming gradient per repeat of a
    token. In bfloat16 the sum of 1024 repeats must be rounded once (found by
    gpt_backward.long_batch at 339 % of its budget when the scatter-add ran in bfloat16):
    within one unit roundoff of the exact sum of the same bfloat16 inputs."""
    import jax
    import jax.numpy as jnp

    from gptspec.adapters.jax import ops

    rng = np.random.default_rng(0)
    W_E = jnp.asarray(rng.normal(0, 0.02, (4, 8)), jnp.bfloat16)
    tokens = jnp.asarray(np.full(1024, 2), jnp.int32)
    G = jnp.asarray(rng.uniform(0.5, 1.5, (1024, 8)), jnp.bfloat16)  # one sign: no cancellation
    grad = jax.grad(lambda w: jnp.sum(ops.token_embedding(tokens, w).astype(jnp.float32)
                                      * G.astype(jnp.float32)))(W_E)
    exact = np.asarray(G, np.float64).sum(axis=0)
    got = np.asarray(grad[2], np.float64)
    u = 2.0 ** -8  # bfloat16's unit roundoff
    assert np.all(np.abs(got - exact) <= u * np.abs(exact)), (got, exact)


def test_jax_localises_a_planted_bug():
    """The operations are exposed under their reference names: a bug in one is reported
    on that check, and the model's check is blocked by it rather than failing alone."""
    from gptspec.adapters.jax import JaxBackend, ops

    class NoShift(JaxBackend):
        def softmax(self, z, axis=-1):
            import jax.numpy as jnp

            e = jnp.exp(jnp.asarray(z, jnp.float32))
            return np.asarray(e / e.sum(axis=axis, keepdims=True))

    results = statuses(NoShift(dtype="float32"), "softmax.differential",
                       "attention_weights.differential")
    assert results["softmax.differential"].status == "fail"
    assert results["attention_weights.differential"].status == "blocked"
    assert "softmax" in ops.__all__


# --- the not-applicable mechanism (backend-neutral) ------------------------------------------


class PreLNOnly:
    """The reference, but declaring that it runs pre-LN models only."""

    name, version, device, dtype = "pre-ln-only", "0", "cpu", "float64"
    protocol_version = 2

    @staticmethod
    def supports(config):
        return None if config.norm == "pre" else f"norm={config.norm!r}: pre-LN only"

    def forward(self, tokens, params, config):
        return ref.gpt_forward(tokens, params, config)

    def block_post_ln(self, H, p, config):
        raise NotApplicable("post-LN blocks: pre-LN only")


def test_examples_a_backend_cannot_express_are_not_applicable_not_failed():
    results = statuses(PreLNOnly(), "gpt_forward.differential", "block_post_ln.differential",
                       area="forward")
    model = results["gpt_forward.differential"]
    assert model.status == "pass" and model.not_applicable > 0 and model.examples > 0
    assert "pre-LN only" in model.detail
    block = results["block_post_ln.differential"]
    assert block.status == "not-applicable" and block.examples == 0
    assert block.detail == "norm='post': pre-LN only"


# --- transformers ------------------------------------------------------------------------------


def test_transformers_adapters_refuse_what_gpt2_cannot_express():
    for name in ("hf-eager", "hf-sdpa"):
        backend = load_backend(name, dtype="float32")
        assert backend.supports(GPT2_LIKE) is None
        reason = backend.supports(POST_LN)
        assert reason and "\n" not in reason and "norm='post'" in reason
        with pytest.raises(NotApplicable, match="norm='post'"):
            backend.forward(np.array([[1, 2]]), small_params(POST_LN), POST_LN)


@pytest.mark.parametrize("name", ["hf-eager", "hf-sdpa"])
def test_transformers_passes_a_quick_subset(name, tmp_path):
    """Run as a user runs it, in a fresh process: Hypothesis mines constants from every
    module imported beside the test, so inside this test session (all test modules
    collected) the same seed draws other examples, and those of the generation check all
    had attn_bias=False, which GPT-2 cannot express."""
    import json
    from types import SimpleNamespace

    report = tmp_path / "report.json"
    checks = ("gpt_forward.differential", "generate.greedy_reference",
              "block_post_ln.differential")
    subprocess.run([sys.executable, "-m", "gptspec", "conformance", "--backend", name,
                    "--profile", "quick", "--dtype", "float32", "--report", str(report),
                    *[arg for c in checks for arg in ("--check", c)]],
                   check=False, capture_output=True, timeout=900)
    run = json.loads(report.read_text())["runs"][0]
    results = {c["id"]: SimpleNamespace(**c) for c in run["checks"]}
    assert results["gpt_forward.differential"].status == "pass"
    assert results["gpt_forward.differential"].not_applicable > 0
    assert results["generate.greedy_reference"].status == "pass"
    assert results["block_post_ln.differential"].status == "not-implemented"
