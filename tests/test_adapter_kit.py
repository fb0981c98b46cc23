"""The adapter kit (gptspec.adapters.kit): the operation list read from the spec registry,
the optional-operation plumbing, and generate around an engine's logits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gptspec import reference as ref
from gptspec.adapters.kit import OptionalOperations, forward_operations, generate_by_forward
from gptspec.fast import ops as fast_ops
from gptspec.spec import REGISTRY, GPTConfig, init_parameters


def test_the_operations_are_the_forward_entries_but_the_whole_model():
    forward = {e.id for e in REGISTRY if e.group in ("embedding", "attention", "block", "output")}
    assert set(forward_operations()) == forward - {"gpt_forward"}
    # the built-in backend writes every one (its list is explicit: importing the registry
    # would cost every command that imports gptspec.fast the spec's sympy)
    assert set(fast_ops.__all__) == set(forward_operations())


class Doubling(OptionalOperations):
    OPERATIONS = ("softmax", "relu")

    def _operation(self, name: str) -> Any:
        return lambda x: 2 * getattr(ref, name)(x)


def test_the_plumbing_exposes_exactly_the_declared_operations():
    backend = Doubling()
    assert backend.implemented_ops() == ["softmax", "relu"]
    assert backend.relu(np.array([-1.0, 3.0])).tolist() == [0.0, 6.0]
    assert {"softmax", "relu"} <= set(dir(backend))
    assert getattr(backend, "layer_norm", None) is None  # not implemented, not a failure
    with pytest.raises(AttributeError, match="no attribute or operation 'gelu'"):
        backend.gelu  # noqa: B018


CONFIG = GPTConfig(vocab_size=13, n_ctx=5, d_model=8, n_layers=1, n_heads=2, d_ff=8)
PARAMS = init_parameters(CONFIG, seed=3, std=0.5)


def _last_rows(contexts: list[list[int]]) -> np.ndarray:
    return np.stack([ref.gpt_forward(np.asarray(c), PARAMS, CONFIG)[-1] for c in contexts])


@pytest.mark.parametrize("eot", [None, 4])
def test_generate_around_the_reference_logits_is_the_reference_generate(eot):
    prompts = [[1, 2, 3], [7], [5, 5, 5, 5, 5, 5]]  # the last one longer than n_ctx
    got = generate_by_forward(_last_rows, prompts, PARAMS, CONFIG, 8, temperature=0.0,
                              eot_token=eot, return_logits=True)
    want = ref.generate(prompts, PARAMS, CONFIG, 8, temperature=0.0, eot_token=eot,
                        return_logits=True)
    assert got[0] == want[0]
    for g, w in zip(got[1], want[1], strict=True):
        np.testing.assert_allclose(g, w.astype(np.float32))
    # one prompt: the uniforms are drawn in the same order as the reference's
    options = dict(temperature=0.8, top_k=5, top_p=0.9)
    assert generate_by_forward(_last_rows, [[1, 2]], PARAMS, CONFIG, 9,
                               rng=np.random.default_rng(1), **options) == \
        ref.generate([[1, 2]], PARAMS, CONFIG, 9, rng=np.random.default_rng(1), **options)


def test_generate_refuses_bad_settings_in_one_line():
    with pytest.raises(ValueError, match="needs an explicit seeded rng"):
        generate_by_forward(_last_rows, [[1]], PARAMS, CONFIG, 2, temperature=1.0)
