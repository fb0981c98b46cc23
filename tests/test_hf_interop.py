"""transformers interop: import a random GPT2LMHeadModel, export back, round trip.

transformers is the peer: in float64 it must agree with the float64 reference to
1e-10 relative (a layout or formula mistake shows up at 1e-3 or worse); in float32 the
reference's derived budget (gptspec.conformance.budgets) bounds both it and our backend.
"""

from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from gptspec.conformance.budgets import Precision, compare, gpt_forward_bound  # noqa: E402
from gptspec.fast import hf_interop  # noqa: E402
from gptspec.fast.hf_interop import (  # noqa: E402
    InteropError,
    config_to_hf,
    from_hf_model,
    load_hf_dir,
    save_hf_dir,
    to_hf_model,
)
from gptspec.reference.forward import gpt_forward  # noqa: E402
from gptspec.spec import PRESETS  # noqa: E402

F64_RELATIVE = 1e-10

HF_CONFIGS = {
    "gelu_new-tied": dict(activation_function="gelu_new"),
    "gelu-untied": dict(activation_function="gelu", tie_word_embeddings=False),
    "relu-narrow-ffn": dict(activation_function="relu", n_inner=40),
}


def random_hf_model(dtype=torch.float64, seed: int = 0, **overrides):
    """A GPT2LMHeadModel with every parameter random, LayerNorm gains and biases too
    (fresh LayerNorms are exactly 1 and 0, which would hide a swapped mapping)."""
    kwargs = dict(vocab_size=97, n_positions=24, n_embd=48, n_layer=3, n_head=4,
                  bos_token_id=None, eos_token_id=None)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**kwargs)).to(dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.3 if ".ln_" in name else 0.05))
    return model


def tokens_for(config, batch=2, seed=1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, config.vocab_size, size=(batch, config.n_ctx))


def hf_logits(model, tokens) -> np.ndarray:
    with torch.no_grad():
        return model(torch.as_tensor(tokens)).logits.double().numpy()


def relative(actual, expected) -> float:
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


@pytest.mark.parametrize("case", sorted(HF_CONFIGS))
def test_reference_reproduces_transformers_float64(case):
    model = random_hf_model(**HF_CONFIGS[case])
    config, params = from_hf_model(model)
    assert config.tied_embeddings == model.config.tie_word_embeddings
    tokens = tokens_for(config)
    assert relative(gpt_forward(tokens, params, config), hf_logits(model, tokens)) <= F64_RELATIVE


def test_a_swapped_mapping_is_caught(monkeypatch):
    """The 1e-10 comparison catches importing ln_2's gain as ln_1's."""
    monkeypatch.setitem(hf_interop.BLOCK_NAMES, "ln_1.weight", "ln_2.weight")
    model = random_hf_model()
    config, params = from_hf_model(model)
    tokens = tokens_for(config)
    assert relative(gpt_forward(tokens, params, config), hf_logits(model, tokens)) > 1e-4


def test_a_wrong_activation_is_caught():
    """gelu_new (tanh) and gelu (erf) differ by ~1e-3: the comparison tells them apart."""
    model = random_hf_model(activation_function="gelu_new")
    config, params = from_hf_model(model)
    tokens = tokens_for(config)
    wrong = config.replace(ffn="gelu")
    assert relative(gpt_forward(tokens, params, wrong), hf_logits(model, tokens)) > 1e-6


@pytest.mark.parametrize("case", sorted(HF_CONFIGS))
def test_float32_transformers_and_fast_backend_within_the_derived_budget(case):
    from gptspec.fast.model import GPT

    model = random_hf_model(dtype=torch.float32, **HF_CONFIGS[case])
    config, params = from_hf_model(model)  # float32 values, held exactly in float64
    tokens = tokens_for(config)
    expected = gpt_forward(tokens, params, config)
    bound = gpt_forward_bound(tokens, params, config, Precision.of("float32"))
    hf = compare(hf_logits(model, tokens), expected, bound)
    assert hf.passed, hf.describe()
    fast = GPT.from_parameters(config, params, device="cpu", dtype=torch.float32).eval()
    with torch.no_grad():
        ours = fast(torch.as_tensor(tokens)).double().numpy()
    result = compare(ours, expected, bound)
    assert result.passed, result.describe()


@pytest.mark.parametrize("case", sorted(HF_CONFIGS))
def test_export_loads_in_transformers_with_the_same_logits(tmp_path, case):
    source = random_hf_model(**HF_CONFIGS[case])
    config, params = from_hf_model(source)
    out = save_hf_dir(tmp_path / "hf", config, params, dtype=torch.float64)
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    loaded = transformers.GPT2LMHeadModel.from_pretrained(str(out), dtype=torch.float64).eval()
    tokens = tokens_for(config)
    assert relative(hf_logits(loaded, tokens), gpt_forward(tokens, params, config)) \
        <= F64_RELATIVE


def test_float32_export_within_the_derived_budget(tmp_path):
    config = PRESETS["tiny"]
    from gptspec.conformance.budgets import round_to
    from gptspec.spec import init_parameters

    params = {k: round_to(v, "float32") for k, v in init_parameters(config, seed=5).items()}
    out = save_hf_dir(tmp_path / "hf", config, params)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(str(out)).eval()
    assert loaded.dtype == torch.float32
    tokens = tokens_for(config)
    result = compare(hf_logits(loaded, tokens), gpt_forward(tokens, params, config),
                     gpt_forward_bound(tokens, params, config, Precision.of("float32")))
    assert result.passed, result.describe()


@pytest.mark.parametrize("case", sorted(HF_CONFIGS))
def test_round_trip_is_exact(tmp_path, case):
    source = random_hf_model(dtype=torch.float32, **HF_CONFIGS[case])
    config, params = from_hf_model(source)
    out = save_hf_dir(tmp_path / "hf", config, params)
    config2, params2 = load_hf_dir(out)
    assert config2 == config
    assert params2.keys() == params.keys()
    for k in params:
        np.testing.assert_array_equal(params2[k], params[k])
    exported = to_hf_model(config2, params2).state_dict()
    for k, v in source.state_dict().items():
        assert torch.equal(exported[k], v), k


@pytest.mark.parametrize("preset, field", [
    ("tiny-post", "norm='post'"),
    ("tiny-guide", "norm='guide'"),
    ("blueprint", "norm='post'"),
])
def test_inexpressible_presets_are_refused(preset, field):
    with pytest.raises(InteropError, match=field):
        config_to_hf(PRESETS[preset])


@pytest.mark.parametrize("change, field", [
    (dict(ffn="guide_product", d_ff=32), "ffn='guide_product'"),
    (dict(bias=False), "bias=False"),
    (dict(tied_embeddings=False, output_bias=True), "output_bias=True"),
    (dict(final_norm=False), "final_norm=False"),
])
def test_inexpressible_fields_are_refused(change, field):
    config = PRESETS["tiny"].replace(**change)
    with pytest.raises(InteropError, match=field) as err:
        config_to_hf(config)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("option, value", [
    ("scale_attn_by_inverse_layer_idx", True),
    ("scale_attn_weights", False),
    ("activation_function", "silu"),
])
def test_transformers_options_without_a_counterpart_are_refused(option, value):
    model = random_hf_model(**{option: value})
    with pytest.raises(InteropError, match=option):
        from_hf_model(model)


def test_bad_directories(tmp_path):
    with pytest.raises(InteropError, match="no config.json"):
        load_hf_dir(tmp_path)
    model = random_hf_model(dtype=torch.float32)
    model.save_pretrained(str(tmp_path / "bin"))
    (tmp_path / "bin" / "model.safetensors").unlink()  # as if only pickled weights were there
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(InteropError, match="no .safetensors"):
        load_hf_dir(tmp_path / "bin")
    config, params = from_hf_model(model)
    out = save_hf_dir(tmp_path / "ok", config, params)
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(InteropError, match="cannot be loaded") as err:
        load_hf_dir(out)
    assert "\n" not in str(err.value)
    with pytest.raises(InteropError, match="already exists"):
        save_hf_dir(out, config, params)
    (out / "config.json").write_text("{not json")
    with pytest.raises(InteropError, match="config.json cannot be read") as err:
        load_hf_dir(out)
    assert "\n" not in str(err.value)
    (out / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(InteropError, match="model_type 'bert' is not 'gpt2'"):
        load_hf_dir(out)


def test_convert_command_round_trip(tmp_path, capsys):
    from gptspec.cli import main
    from gptspec.fast.checkpoint import load_model, save_model

    config = PRESETS["tiny"]
    from gptspec.conformance.budgets import round_to
    from gptspec.spec import init_parameters

    params = {k: round_to(v, "float32") for k, v in init_parameters(config, seed=7).items()}
    save_model(tmp_path / "ck", config, params)
    assert main(["convert", "--to-hf", str(tmp_path / "ck"), str(tmp_path / "hf")]) == 0
    loaded = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf"))
    assert from_hf_model(loaded)[0] == config
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0
    config2, params2 = load_model(tmp_path / "back")
    assert config2 == config
    for k in params:
        np.testing.assert_array_equal(params2[k], params[k])
    capsys.readouterr()
    # refusals: an existing output, a missing source, an inexpressible model
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), str(tmp_path / "back")]) == 2
    assert main(["convert", "--to-hf", str(tmp_path / "none"), str(tmp_path / "x")]) == 2
    save_model(tmp_path / "post", PRESETS["tiny-post"], init_parameters(PRESETS["tiny-post"]))
    assert main(["convert", "--to-hf", str(tmp_path / "post"), str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("gptspec convert: error:") for line in err)
    assert "already exists" in err[0] and "not found" in err[1] and "norm='post'" in err[2]
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_transformers_default_gpt2_config_is_the_gpt2_preset():
    assert hf_interop.config_from_hf(transformers.GPT2Config()) == PRESETS["gpt2"]


@pytest.mark.parametrize("name", ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"])
def test_transformers_counts_the_same_parameters(name):
    """An independent count: transformers' own model of each size (on the meta device, so
    no memory), its distinct parameters (the tied lm_head counted once)."""
    from gptspec.reference import param_count_total

    config = PRESETS[name]
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(config_to_hf(config))
    distinct = {id(p): p.numel() for p in model.parameters()}
    assert sum(distinct.values()) == param_count_total(config)
